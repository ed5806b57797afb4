"""The generated v1 JSON Schemas: shipped files current, definitions equal to the code.

The definitions live in the protocol layer and cannot import the layers that own some of
their values; every such value names its source, and this module resolves each one.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import io
import json
import typing
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from magi_code.composition import build_coordinator
from magi_code.protocol.errors import MESSAGES, ErrorCode
from magi_code.protocol.limits import ADVERTISED_LIMITS
from magi_code.protocol.schema import (
    CONSUMER_BUNDLE,
    SHIPPED,
    approvals,
    encode,
    main,
    rewind,
    routes,
    schema_documents,
    session,
    shipped_documents,
)
from magi_code.protocol.schema import definitions as v1
from magi_code.protocol.schema.model import Arr, Int, Obj, Profile, Shape, Str, Union, walk
from magi_code.storage.launch import LaunchContext
from magi_code.turns import activity
from tests.contract.fixture_runner import FIXTURES
from tests.support import wire_schema

# -- shipped files -------------------------------------------------------------------------


def test_the_shipped_schema_files_are_current() -> None:
    """Regenerates the files; fails when that changed anything (commit the result)."""
    expected = {f"{name}.json": encode(doc) for name, doc in shipped_documents().items()}
    shipped = {path.name: path.read_text(encoding="utf-8") for path in SHIPPED.glob("*.json")}
    if shipped != expected:
        for name in set(shipped) - set(expected):
            (SHIPPED / name).unlink()
        for name, text in expected.items():
            (SHIPPED / name).write_text(text, encoding="utf-8")
        stale = sorted(
            n for n in expected.keys() | shipped.keys() if shipped.get(n) != expected.get(n)
        )
        pytest.fail(f"regenerated stale schema files (commit them): {stale}")


@pytest.mark.parametrize("profile", ["strict", "consumer"])
def test_every_document_is_a_valid_2020_12_schema_and_self_contained(profile: Profile) -> None:
    ids = set()
    for name, document in schema_documents(profile).items():
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        wire_schema.WireValidator.check_schema(document)
        ids.add(document["$id"])
        refs = list(_values(document, "$ref"))
        if name != "v1" and profile == "strict":
            assert refs == [], name
        assert all(r.startswith("#/$defs/") for r in refs), name
        for ref in refs:
            assert ref.removeprefix("#/$defs/") in document["$defs"], (name, ref)
    assert len(ids) == len(schema_documents(profile))
    strict_ids = {d["$id"] for d in schema_documents().values()}
    assert profile == "strict" or not ids & strict_ids


def _values(node: Any, key: str) -> Iterator[Any]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _values(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _values(item, key)


def test_documents_cover_every_operation_and_event() -> None:
    names = set(schema_documents())
    for op in v1.OPERATIONS:
        assert {f"request.{op.name}", f"response.{op.name}"} <= names
    for ev in v1.EVENTS:
        assert f"event.{ev.name}" in names
    assert len(names) == 4 + 2 * len(v1.OPERATIONS) + len(v1.EVENTS) + 1


@pytest.mark.parametrize("profile", ["strict", "consumer"])
def test_main_prints_the_bundle_and_writes_every_document(tmp_path: Path, profile: Profile) -> None:
    flags = ["--consumer"] if profile == "consumer" else []
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(flags) == 0
    assert json.loads(out.getvalue()) == schema_documents(profile)["v1"]
    assert main([*flags, "--out", str(tmp_path / "schemas")]) == 0
    written = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert written == sorted(f"{name}.json" for name in schema_documents(profile))
    bundle = json.loads((tmp_path / "schemas" / "v1.json").read_text())
    assert bundle == schema_documents(profile)["v1"]


def test_the_package_ships_the_consumer_bundle() -> None:
    shipped = json.loads((SHIPPED / f"{CONSUMER_BUNDLE}.json").read_text(encoding="utf-8"))
    assert shipped == schema_documents("consumer")["v1"]
    assert shipped["$id"] == "urn:magi-code:protocol:v1:consumer"
    # A client reads responses and events, never requests.
    assert [r["$ref"] for r in shipped["oneOf"]] == [
        "#/$defs/record.response",
        "#/$defs/record.event",
    ]


def test_main_reports_an_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--out", str(blocker)]) == 1


# -- definitions against the code -----------------------------------------------------------


def test_the_generated_route_facts_are_current() -> None:
    """Regenerates the block of ``protocol/operations.py``; fails when that changed it."""
    text = routes.TARGET.read_text(encoding="utf-8")
    fresh = routes.refreshed(text)
    if fresh != text:
        routes.TARGET.write_text(fresh, encoding="utf-8")
        pytest.fail("regenerated the stale route facts of protocol/operations.py (commit them)")


def test_the_contract_fixtures_advertised_sets_are_current() -> None:
    """Regenerates the operation and event sets of the contract fixtures'
    ``advertised.json``; fails when that changed it."""
    advertised = FIXTURES / "advertised.json"
    text = advertised.read_text(encoding="utf-8")
    sets = {"operations": list(v1.OPERATION_NAMES), "events": list(v1.EVENT_NAMES)}
    fresh = json.dumps(json.loads(text) | sets, indent=2) + "\n"
    if fresh != text:
        advertised.write_text(fresh, encoding="utf-8")
        pytest.fail("regenerated the stale sets of the fixtures' advertised.json (commit it)")


async def test_operations_and_events_are_the_route_table(tmp_path: Path) -> None:
    ctx = LaunchContext(tmp_path, tmp_path, {"MC_HOME": str(tmp_path)})
    coordinator = await build_coordinator(ctx)
    assert [op.name for op in v1.OPERATIONS] == coordinator.operations
    assert list(v1.OPERATION_NAMES) == coordinator.operations
    assert [ev.name for ev in v1.EVENTS] == coordinator.events == list(v1.EVENT_NAMES)
    for op in v1.OPERATIONS:
        route = coordinator._routes[op.name]
        assert (op.session, op.gated) == (route.session.value, route.gated), op.name


def test_errors_are_the_registry() -> None:
    assert set(v1.ERROR_DOCS) == set(ErrorCode) == set(MESSAGES)
    assert tuple(code.value for code in ErrorCode) == v1.ERROR_CODES
    for op in v1.OPERATIONS:
        for code, when in op.errors:
            assert isinstance(code, ErrorCode) and when, op.name


def test_limits_are_the_advertised_limits() -> None:
    assert {f.name: f.shape.const for f in v1.LIMITS.fields} == ADVERTISED_LIMITS  # type: ignore[attr-defined]


def _resolve(source: str) -> Any:
    module_name, _, attr = source.partition(":")
    module = importlib.import_module(module_name)
    name, _, parameter = attr.partition(".")
    value = getattr(module, name)
    if parameter:
        return typing.get_type_hints(value)[parameter]
    return value


def _literal_values(hint: Any) -> list[Any]:
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType):
        return [v for arg in typing.get_args(hint) for v in _literal_values(arg)]
    raise AssertionError(f"not a Literal type: {hint!r}")


def _as_values(value: Any) -> list[Any]:
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return [member.value for member in value]
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, (tuple, list)):
        return list(value)
    return _literal_values(value)


def _every_shape() -> Iterator[tuple[str, Shape]]:
    roots: list[tuple[str, Shape]] = [
        ("envelope.request", v1.REQUEST_ENVELOPE),
        ("envelope.response", v1.RESPONSE_ENVELOPE),
        ("envelope.event", v1.EVENT_ENVELOPE),
    ]
    roots += [(f"request.{op.name}", op.request) for op in v1.OPERATIONS]
    roots += [(f"response.{op.name}", op.response) for op in v1.OPERATIONS]
    roots += [(f"event.{ev.name}", ev.payload) for ev in v1.EVENTS]
    roots += list(approvals.shapes().items())
    roots += list(rewind.shapes().items())
    roots += list(session.shapes().items())
    for root, shape in roots:
        for path, inner in walk(shape):
            yield f"{root}:{path}", inner


def test_every_sourced_value_equals_the_code() -> None:
    checked = 0
    for where, shape in _every_shape():
        for attribute, source in shape.sources.items():
            actual = _resolve(source)
            if attribute == "enum":
                assert isinstance(shape, Str) and shape.enum is not None
                values = _as_values(actual)
                ordered = isinstance(actual, (tuple, list))
                mine = list(shape.enum) if ordered else sorted(shape.enum)
                assert mine == (values if ordered else sorted(values)), where
            elif attribute == "fields":
                assert isinstance(shape, Obj)
                assert [f.name for f in shape.fields] == list(actual), where
                consts = {f.name: getattr(f.shape, "const", None) for f in shape.fields}
                assert consts == dict(actual), where
            else:
                assert getattr(shape, attribute) == actual, (where, attribute)
            checked += 1
    assert checked >= 15


def test_sources_cover_every_enum_owned_elsewhere() -> None:
    """Every value set the code defines outside the protocol layer is tied to its source."""
    sourced = {source for _, shape in _every_shape() for source in shape.sources.values()}
    for needed in (
        "magi_code.config.ids:THINKING_LEVELS",
        "magi_code.config.catalog:CatalogState",
        "magi_code.config.settings:Scope",
        "magi_code.auth.login:TERMINAL_STATES",
        "magi_code.turns.activity:LifecycleStatus",
        "magi_code.turns.activity:lifecycle.category",
        "magi_code.turns.activity:ContextSource",
        "magi_code.turns.activity:UsageSource",
        "magi_code.turns.activity:CompactionStatus",
        "magi_code.turns.runtime:ALLOWLISTED_TOOL_NAMES",
        "magi_code.sessions.records:TerminalStatus",
        "magi_code.core.service_info:ACTIVITY_CAPABILITIES",
        "magi_code.core.turns:MAX_DELTA_BYTES",
        "magi_code.turns.failures:LABELS",
        "magi_code.turns.failures:MAX_REMEDY_BYTES",
    ):
        assert needed in sourced, needed


# -- the activity projection, every builder and every enumerated value ----------------------

_ACTIVITY = wire_schema.validator  # alias for brevity


def _check_activity(payload: dict[str, Any]) -> None:
    event = {"turn_id": "turn_1", "sequence": 1, "activity": payload}
    wire_schema.check("event.turn.activity", event)
    variant = next(
        v
        for v in v1.ACTIVITY.variants
        if v.member("kind").shape.const == payload["kind"]  # type: ignore[attr-defined]
    )
    required = {f.name for f in variant.fields if f.required}
    assert required <= set(payload) <= {f.name for f in variant.fields}


def _enum(shape: Shape) -> tuple[str, ...]:
    assert isinstance(shape, Str) and shape.enum is not None
    return shape.enum


def _variant(kind: str) -> Obj:
    return next(v for v in v1.ACTIVITY.variants if v.member("kind").shape.const == kind)  # type: ignore[attr-defined]


def test_every_activity_builder_output_fits_the_schema() -> None:
    aid = activity.identity("tool-call", "turn_1", "call_1")
    lifecycle = _variant("lifecycle")
    for category in _enum(lifecycle.member("category").shape):
        for status in _enum(lifecycle.member("status").shape):
            _check_activity(activity.lifecycle(aid, category, status))  # type: ignore[arg-type]
            parent = activity.identity("subagent", "turn_1", "0")
            _check_activity(activity.lifecycle(aid, category, status, parent))  # type: ignore[arg-type]
    tool = _variant("tool")
    names = frozenset(_enum(tool.member("tool_name").shape.inner))  # type: ignore[attr-defined]
    for status in _enum(tool.member("status").shape):
        for name in [*sorted(names), "mcp__srv__x"]:
            for server in (None, "srv"):
                for timed_out in (None, True, False):
                    _check_activity(
                        activity.tool(
                            aid,
                            tool_name=name,
                            builtin_names=names,
                            server_name=server,
                            status=status,  # type: ignore[arg-type]
                            timed_out=timed_out,
                        )
                    )
    for source in _enum(_variant("context").member("source").shape):
        for reasoning in (None, 5):
            _check_activity(
                activity.context(
                    aid,
                    current_tokens=10,
                    max_tokens=100,
                    reasoning_tokens=reasoning,
                    request_sequence=1,
                    source=source,  # type: ignore[arg-type]
                )
            )
    for source in _enum(_variant("usage").member("source").shape):
        _check_activity(
            activity.usage(
                aid,
                effective_input=1,
                output=2,
                cache_read=0,
                cache_known=False,
                request_sequence=1,
                final_usage=True,
                source=source,  # type: ignore[arg-type]
            )
        )
    for status in _enum(_variant("compaction").member("status").shape):
        _check_activity(activity.compaction(aid, status, 10, 100))  # type: ignore[arg-type]
    for text in ("", "summary", "é" * 3000, "x" * 20000, "token sk-" + "a" * 40):
        _check_activity(activity.reasoning_summary(aid, text))


def test_the_activity_variants_are_the_builders() -> None:
    builders = {
        "lifecycle": activity.lifecycle,
        "tool": activity.tool,
        "context": activity.context,
        "usage": activity.usage,
        "compaction": activity.compaction,
        "reasoning_summary": activity.reasoning_summary,
    }
    assert v1.ACTIVITY.tags() == list(builders)
    for name, builder in builders.items():
        assert inspect.isfunction(builder), name


# -- the shape model itself ----------------------------------------------------------------


def test_byte_bounds_are_checked_in_bytes() -> None:
    shape = Str(max_bytes=4)
    document = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    from magi_code.protocol.schema.model import to_schema

    validator = wire_schema.WireValidator({**document, **to_schema(shape)})
    assert validator.is_valid("abcd")
    assert validator.is_valid("éé")
    assert not validator.is_valid("ééé")  # 3 code points, 6 bytes
    assert not validator.is_valid("abcde")
    arr = wire_schema.WireValidator({**document, **to_schema(Arr(items=Int()))})
    assert arr.is_valid([1] * 64) and not arr.is_valid([1] * 65)
    union = wire_schema.WireValidator({**document, **to_schema(v1.REPLAY_ITEM)})
    assert isinstance(v1.REPLAY_ITEM, Union)
    assert not union.is_valid({"kind": "message"})
