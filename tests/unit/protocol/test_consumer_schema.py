"""The consumer profile: the JSON Schema bundle a client validates against, and its Python
twin (``protocol.schema.consumer``), against the consumer fixtures and against each other.

The consumer fixtures (``tests/fixtures/application_service/consumer/``) label each stream
``accept`` or ``reject-before-mutation``; a reject fixture's ``detected_by`` says whether
its last record breaks the record alone (``record``: the schema must refuse it), needs
what the schema cannot see (``stream``: correlation, order, terminals, members that must
agree; the schema accepts the record) or is not a record at all (``framing``: not JSON,
over the record bound, no newline).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.protocol.limits import MAX_JSON_DEPTH
from magi_code.protocol.schema import definitions as v1
from magi_code.protocol.schema import schema_documents
from magi_code.protocol.schema.consumer import Mismatch, check_record
from magi_code.protocol.schema.model import Nullable, Obj, Shape, Str, walk
from tests.support import wire_schema
from tests.unit.client.test_v1stream import fixture_files, load, service_line

CONSUMER = wire_schema.CONSUMER


def records(path: Path) -> Iterator[tuple[int, bool, Any]]:
    """(step, whether it is a reject fixture's last step, the decoded record) for every
    service record of a fixture that is a JSON line within the record bound."""
    header, steps = load(path)
    for index, step in enumerate(steps, start=1):
        line = service_line(step)
        if line is None or len(line) > 65536 or not line.endswith(b"\n"):
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        yield index, header["verdict"] != "accept" and index == len(steps), record


def schema_accepts(record: Any) -> bool:
    return not wire_schema.errors(CONSUMER, record)


def checker_accepts(record: Any) -> bool:
    try:
        check_record(record)
    except Mismatch:
        return False
    return True


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.stem)
def test_the_consumer_schema_gives_every_fixture_its_verdict(path: Path) -> None:
    header, steps = load(path)
    seen_last = False
    for index, last, record in records(path):
        if not last:
            wire_schema.check(CONSUMER, record)  # accept fixtures, and every prefix
            continue
        seen_last = True
        assert schema_accepts(record) == (header["detected_by"] == "stream"), (path.name, index)
    if header["verdict"] != "accept" and header["detected_by"] != "framing":
        # service_ends is the one stream step that is not a record.
        assert seen_last or "service_ends" in steps[-1], path.name


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.stem)
def test_the_python_checker_agrees_with_the_schema_on_every_fixture(path: Path) -> None:
    for index, _last, record in records(path):
        assert checker_accepts(record) == schema_accepts(record), (path.name, index)


def _mutations(record: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Records that differ from ``record`` in one place: every member removed, nulled,
    retyped, given an unknown string, plus unknown members of every object."""
    paths: list[tuple[Any, ...]] = []

    def collect(value: Any, path: tuple[Any, ...]) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                paths.append((*path, key))
                collect(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value[:3]):
                paths.append((*path, index))
                collect(item, (*path, index))

    collect(record, ())
    for path in paths:
        for label, replace in (
            ("null", None),
            ("string", "zz-unknown"),
            ("number", 7),
            ("fraction", 0.5),
            ("bool", True),
            ("list", []),
            ("object", {}),
        ):
            mutated = copy.deepcopy(record)
            parent = mutated
            for part in path[:-1]:
                parent = parent[part]
            parent[path[-1]] = replace
            yield f"{path}={label}", mutated
        mutated = copy.deepcopy(record)
        parent = mutated
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict):
            del parent[path[-1]]
            yield f"{path} removed", mutated
        mutated = copy.deepcopy(record)
        target = mutated
        for part in path:
            target = target[part]
        if isinstance(target, dict):
            target["x_future"] = {"nested": [1, "two", None]}
            yield f"{path}+member", mutated


def _fixture_records() -> list[Any]:
    """The distinct records of the accept fixtures, but those at the size bounds."""
    found: dict[bytes, Any] = {}
    for path in fixture_files():
        if path.stem.startswith("accept."):
            for _, _, record in records(path):
                encoded = orjson.dumps(record)
                if len(encoded) <= 4096:
                    found[encoded] = record
    return list(found.values())


# Every change of every record is about 7,200 distinct cases, 2 ms or more each (the
# schema's ``oneOf``): the test checks every eighth, a spread over every record, member
# and kind of change.
STRIDE = 8


def test_the_python_checker_agrees_with_the_schema_on_one_place_changes() -> None:
    distinct = {
        orjson.dumps(mutated, option=orjson.OPT_SORT_KEYS): (label, mutated)
        for record in _fixture_records()
        for label, mutated in _mutations(record)
    }
    changes = list(distinct.values())
    refused = 0
    for label, mutated in changes[::STRIDE]:
        expected = schema_accepts(mutated)
        assert checker_accepts(mutated) == expected, label
        refused += not expected
    assert len(changes) // STRIDE > 850 and refused > 600


def _activity_record(activity: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocol_version": 1,
        "kind": "event",
        "event_id": "evt-1",
        "request_id": "t-1",
        "session_id": "ses_a",
        "event": "turn.activity",
        "payload": {"turn_id": "turn_1", "sequence": 1, "activity": activity},
    }


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = {"d": value}
    return value


def test_unknown_members_may_nest_to_the_record_depth_bound_and_no_deeper() -> None:
    """The record is level 1, the payload 2, an activity 3: an unknown member of the
    activity is level 4 and may hold objects down to level 32."""
    context = {
        "activity_id": "context:" + "c" * 64,
        "kind": "context",
        "current_tokens": 1,
        "max_tokens": 2,
        "reasoning_tokens": None,
        "request_sequence": 1,
        "source": "provider_exact",
    }
    at_bound = _activity_record({**context, "future": _nested(MAX_JSON_DEPTH - 3)})
    too_deep = _activity_record({**context, "future": _nested(MAX_JSON_DEPTH - 2)})
    assert schema_accepts(at_bound) and checker_accepts(at_bound)
    assert not schema_accepts(too_deep) and not checker_accepts(too_deep)


def _output_shapes() -> Iterator[tuple[str, Shape]]:
    roots: list[tuple[str, Shape]] = [
        ("envelope.response", v1.RESPONSE_ENVELOPE),
        ("envelope.event", v1.EVENT_ENVELOPE),
    ]
    roots += [(f"response.{op.name}", op.response) for op in v1.OPERATIONS]
    roots += [(f"event.{ev.name}", ev.payload) for ev in v1.EVENTS]
    for root, shape in roots:
        for path, inner in walk(shape):
            yield f"{root}:{path}", inner
            if inner.consumer is not None:
                for sub, replaced in walk(inner.consumer, path):
                    yield f"{root}:{sub} (consumer)", replaced


def test_only_fields_with_a_defined_fallback_accept_unknown_values() -> None:
    """The contract: unknown enum values are rejected unless the field defines a fallback.
    Here that is an error code (a failure of its request), an advertised operation (left
    unused), an advertised transport other than stdio (ignored) and a failed turn's label
    (its remedy is shown)."""
    with_fallback = {
        where.split(":", 1)[1]
        for where, shape in _output_shapes()
        if isinstance(shape, Str) and shape.fallback is not None
    }
    assert with_fallback == {
        "error.code",
        "failure",
        "operations[]",
        "capabilities.operations[]",
        "transports[] (consumer)",
        "capabilities.transports[] (consumer)",
    }
    tool = next(v for v in v1.ACTIVITY.variants if v.member("kind").shape.const == "tool")  # type: ignore[attr-defined]
    transport = tool.member("transport").shape
    assert isinstance(transport, Str) and transport.enum == ("local", "mcp", "unknown")
    names = v1.EVENT_ENVELOPE.member("event").shape
    assert isinstance(names, Str) and names.fallback is None


def test_every_output_object_is_open_and_every_request_closed() -> None:
    bundle = schema_documents("consumer")["v1"]["$defs"]

    def objects(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if node.get("type") == "object":
                yield node
            for value in node.values():
                yield from objects(value)
        elif isinstance(node, list):
            for value in node:
                yield from objects(value)

    for name, document in bundle.items():
        for obj in objects(document):
            if name.startswith("request.") or name == "envelope.request":
                assert obj.get("additionalProperties") is False or "maxProperties" in obj
            else:
                assert obj.get("additionalProperties") is not False, name
                assert obj["maxProperties"] == 64, name


def test_every_nullable_output_member_is_required() -> None:
    """Absent and ``null`` are not the same: an output member that may be ``null`` is
    always present, so a client must not treat a missing one as ``null``."""
    for where, shape in _output_shapes():
        if isinstance(shape, Obj):
            for member in shape.fields:
                if isinstance(member.shape, Nullable):
                    assert member.required, (where, member.name)
