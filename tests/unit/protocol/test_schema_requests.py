"""The request schemas against the real validators, case by case.

From each operation's declared request shape this module derives valid payloads (minimal,
full, every enumerated value, every bound) and payloads that break exactly one
constraint (each member missing, ``null``, of each wrong JSON type, past each bound, an
unknown member, each cross-member rule). Every case runs through the service's own
inbound path (envelope decoding, the route's session rule, the route's payload
validator) and through the generated schemas (the payload document and the ``v1``
bundle's request record). They must agree: a case is valid for the schema exactly when
the service accepts it, and a rejected case gets the code the definition declares. A
constraint marked ``late`` is checked by the operation after its validator: the
validator accepts it, the schema does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from magi_code.composition import build_coordinator
from magi_code.core.routes import Route, SessionRule
from magi_code.protocol import envelope
from magi_code.protocol.envelope import Rejected, Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_ARRAY_ITEMS, MAX_STRING_BYTES
from magi_code.protocol.schema import definitions as v1
from magi_code.protocol.schema.model import (
    Arr,
    Bool,
    Forbid,
    Int,
    Nullable,
    Obj,
    RequireAny,
    Shape,
    Str,
)
from magi_code.storage.launch import LaunchContext
from tests.support import wire_schema

LIMIT = ErrorCode.LIMIT_EXCEEDED
SESSION = "ses_schema_test"
# Values the service's semantic checks need (not shape): initialize must offer version 1.
BASES: dict[str, dict[str, Any]] = {"initialize": {"supported_protocol_versions": [1]}}


@dataclass(frozen=True)
class Case:
    label: str
    payload: Any
    code: ErrorCode | None  # what the service's validator answers
    schema_valid: bool


def example(shape: Shape, *, full: bool) -> Any:
    if isinstance(shape, Nullable):
        return example(shape.inner, full=full)
    if isinstance(shape, Str):
        if shape.const is not None:
            return shape.const
        if shape.enum is not None:
            return shape.enum[0]
        if shape.example is not None:
            return shape.example
        assert shape.pattern is None, "a pattern needs an example"
        return "x" * max(1, shape.min_length or 0)
    if isinstance(shape, Bool):
        return False if shape.const is None else shape.const
    if isinstance(shape, Int):
        if shape.const is not None:
            return shape.const
        return 1 if shape.minimum is None or shape.minimum <= 1 else shape.minimum
    if isinstance(shape, Arr):
        return [example(shape.items, full=full)] * max(1, shape.min_items or 0)
    if isinstance(shape, Obj):
        value = {f.name: example(f.shape, full=full) for f in shape.fields if full or f.required}
        for rule in shape.rules:
            if isinstance(rule, RequireAny) and not set(rule.names) & set(value):
                name = rule.names[0]
                value[name] = example(shape.member(name).shape, full=full)
        return value
    raise AssertionError(shape)


def _verdict(shape: Shape, constraint: str, label: str, value: Any) -> Case:
    if constraint in shape.late:
        return Case(label + " (checked late)", value, None, False)
    return Case(label, value, shape.code(constraint), False)


_TYPES: dict[str, list[Any]] = {
    "string": [1, True, [], {}],
    "integer": ["1", True, 1.5, [], {}],
    "boolean": [0, "true", [], {}],
    "array": ["x", 1, {}, True],
    "object": ["x", 1, [], True],
}


def _kind(shape: Shape) -> str:
    return {Str: "string", Int: "integer", Bool: "boolean", Arr: "array", Obj: "object"}[
        type(shape)
    ]


def mutations(shape: Shape, value: Any, label: str, *, nullable: bool = False) -> Iterator[Case]:
    """``value`` (valid for ``shape``) changed in one way: valid variants and violations."""
    if isinstance(shape, Nullable):
        yield Case(f"{label} null", None, None, True)
        yield from mutations(shape.inner, value, label, nullable=True)
        return
    if not nullable:
        yield _verdict(shape, "type", f"{label} null", None)
    for wrong in _TYPES[_kind(shape)]:
        yield _verdict(shape, "type", f"{label} = {wrong!r}", wrong)
    if isinstance(shape, Str):
        yield from _string_cases(shape, label)
    elif isinstance(shape, Int):
        yield from _int_cases(shape, label)
    elif isinstance(shape, Bool):
        if shape.const is None:
            yield Case(f"{label} = {not value!r}", not value, None, True)
    elif isinstance(shape, Arr):
        yield from _array_cases(shape, value, label)
    elif isinstance(shape, Obj):
        yield from _object_cases(shape, value, label)


def _string_cases(shape: Str, label: str) -> Iterator[Case]:
    if shape.const is not None:
        yield _verdict(shape, "const", f"{label} other value", shape.const + "x")
        return
    if shape.enum is not None:
        for member in shape.enum:
            yield Case(f"{label} = {member!r}", member, None, True)
        yield _verdict(shape, "enum", f"{label} unknown value", "zz-unknown")
        return
    if shape.min_length:
        short = "x" * (shape.min_length - 1)
        yield _verdict(shape, "min_length", f"{label} too short", short)
    limit = MAX_STRING_BYTES if shape.max_bytes is None else shape.max_bytes
    over = Str(codes={"max_bytes": LIMIT}) if shape.max_bytes is None else shape
    yield Case(f"{label} at {limit} bytes", "a" * limit, None, True)
    yield _verdict(over, "max_bytes", f"{label} over {limit} bytes", "a" * (limit + 1))
    if shape.pattern is None:
        yield Case(f"{label} at {limit} bytes of é", "é" * (limit // 2), None, True)
        bad = "é" * (limit // 2 + 1)
        yield _verdict(over, "max_bytes", f"{label} over {limit} bytes of é", bad)
    for bad in shape.counterexamples:
        yield _verdict(shape, "pattern", f"{label} = {bad!r}", bad)
    if shape.non_blank:
        yield Case(f"{label} padded", "  x\n", None, True)
        for blank in (" ", "\t\n ", "\u3000"):
            yield _verdict(shape, "non_blank", f"{label} blank {blank!r}", blank)


def _int_cases(shape: Int, label: str) -> Iterator[Case]:
    if shape.const is not None:
        yield _verdict(shape, "const", f"{label} other value", shape.const + 1)
        return
    if shape.minimum is not None:
        yield Case(f"{label} = minimum", shape.minimum, None, True)
        yield _verdict(shape, "minimum", f"{label} below minimum", shape.minimum - 1)
    if shape.maximum is not None:
        yield Case(f"{label} = maximum", shape.maximum, None, True)
        yield _verdict(shape, "maximum", f"{label} above maximum", shape.maximum + 1)


def _array_cases(shape: Arr, value: list[Any], label: str) -> Iterator[Case]:
    if shape.min_items:
        yield _verdict(shape, "min_items", f"{label} too few", value[: shape.min_items - 1])
    else:
        yield Case(f"{label} empty", [], None, True)
    limit = MAX_ARRAY_ITEMS if shape.max_items is None else shape.max_items
    over = Arr(items=shape.items, codes={"max_items": LIMIT}) if shape.max_items is None else shape
    full = (value * limit)[:limit]
    yield Case(f"{label} {limit} items", full, None, True)
    yield _verdict(over, "max_items", f"{label} {limit + 1} items", [*full, value[0]])
    for case in mutations(shape.items, value[0], f"{label}[+]"):
        yield Case(case.label, [*value, case.payload], case.code, case.schema_valid)


def _object_cases(shape: Obj, value: dict[str, Any], label: str) -> Iterator[Case]:
    prefix = f"{label}." if label else ""
    if shape.closed:
        yield _verdict(shape, "closed", f"{prefix}zz_unknown present", {**value, "zz_unknown": 1})
    for member in shape.fields:
        name = f"{prefix}{member.name}"
        if member.name in value:
            rest = {k: v for k, v in value.items() if k != member.name}
            if member.required:
                yield _verdict(shape, "required", f"{name} missing", rest)
            elif not any(
                isinstance(r, RequireAny) and not set(r.names) & set(rest) for r in shape.rules
            ):
                yield Case(f"{name} absent", rest, None, True)
            for case in mutations(member.shape, value[member.name], name):
                changed = {**value, member.name: case.payload}
                broken = _broken_rule(shape, changed) if case.schema_valid else None
                if broken is not None:
                    yield Case(f"{case.label} (breaks a rule)", changed, broken, False)
                else:
                    yield Case(case.label, changed, case.code, case.schema_valid)
        else:
            present = {**value, member.name: example(member.shape, full=True)}
            yield Case(f"{name} present", present, None, True)
    for rule in shape.rules:
        if isinstance(rule, RequireAny):
            bare = {k: v for k, v in value.items() if k not in rule.names}
            yield Case(f"{prefix}none of {rule.names}", bare, rule.code, False)
        elif isinstance(rule, Forbid):
            breaking = {
                **value,
                rule.when: rule.value,
                rule.forbidden: example(shape.member(rule.forbidden).shape, full=True),
            }
            yield Case(
                f"{prefix}{rule.forbidden} with {rule.when}={rule.value}",
                breaking,
                rule.code,
                False,
            )


def _broken_rule(shape: Obj, value: dict[str, Any]) -> ErrorCode | None:
    for rule in shape.rules:
        if (
            isinstance(rule, Forbid)
            and value.get(rule.when) == rule.value
            and rule.forbidden in value
        ):
            return rule.code
    return None


def cases(op: v1.Operation) -> Iterator[Case]:
    minimal = {**example(op.request, full=False), **BASES.get(op.name, {})}
    full = {**example(op.request, full=True), **BASES.get(op.name, {})}
    yield Case("minimal", minimal, None, True)
    yield Case("full", full, None, True)
    yield from mutations(op.request, full, "")
    if minimal != full:
        yield from (c for c in mutations(op.request, minimal, "") if c.payload != full)


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Route]:
    import asyncio

    home = tmp_path_factory.mktemp("routes")
    ctx = LaunchContext(home, home, {"MC_HOME": str(home)})
    coordinator = asyncio.run(build_coordinator(ctx))
    return dict(coordinator._routes)


def service_verdict(routes: dict[str, Route], record: dict[str, Any]) -> ErrorCode | None:
    """The service's inbound path up to (not including) the initialization gate."""
    decoded = envelope.decode_record(orjson.dumps(record), lambda _: False)
    if isinstance(decoded, Rejected):
        return decoded.code
    assert isinstance(decoded, Request)
    route = routes.get(decoded.method)
    if route is None:
        return ErrorCode.UNSUPPORTED_OPERATION
    if route.session is SessionRule.FORBIDDEN and decoded.session_id is not None:
        return ErrorCode.INVALID_REQUEST
    if route.session is SessionRule.REQUIRED and decoded.session_id is None:
        return ErrorCode.INVALID_SESSION_ID
    try:
        route.validate(decoded)
    except ServiceError as exc:
        return exc.code
    return None


def record_for(op: v1.Operation, payload: Any, session_id: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "protocol_version": 1,
        "kind": "request",
        "request_id": "r-1",
        "method": op.name,
        "payload": payload,
    }
    if session_id is None and op.session == "required":
        session_id = SESSION
    if session_id is not None:
        record["session_id"] = session_id
    return record


@pytest.mark.parametrize("op", v1.OPERATIONS, ids=lambda op: op.name)
def test_request_schema_matches_the_validator(op: v1.Operation, routes: dict[str, Route]) -> None:
    checked = 0
    for case in cases(op):
        record = record_for(op, case.payload)
        got = service_verdict(routes, record)
        assert got == case.code, f"{op.name} {case.label}: service says {got}, defined {case.code}"
        found = wire_schema.errors(f"request.{op.name}", case.payload)
        assert (not found) == case.schema_valid, (
            f"{op.name} {case.label}: schema valid={not found}, expected {case.schema_valid}"
            + (f" ({found[0].message[:200]})" if found else "")
        )
        bundle = wire_schema.errors("v1", record)
        assert (not bundle) == case.schema_valid, f"{op.name} {case.label}: bundle disagrees"
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("op", v1.OPERATIONS, ids=lambda op: op.name)
def test_outer_session_id_rules(op: v1.Operation, routes: dict[str, Route]) -> None:
    payload = {**example(op.request, full=False), **BASES.get(op.name, {})}
    for session_id, valid_id in ((SESSION, True), ("a.b", False), ("-x", False)):
        record = record_for(op, payload, session_id)
        got = service_verdict(routes, record)
        if op.session == "forbidden":
            expected: ErrorCode | None = ErrorCode.INVALID_REQUEST
        elif (op.session == "required" or op.checks_session) and not valid_id:
            expected = ErrorCode.INVALID_SESSION_ID
        else:
            expected = None
        assert got == expected, (op.name, session_id, got)
        assert (not wire_schema.errors("v1", record)) == (expected is None), (op.name, session_id)
    without = {k: v for k, v in record_for(op, payload).items() if k != "session_id"}
    expected = ErrorCode.INVALID_SESSION_ID if op.session == "required" else None
    assert service_verdict(routes, without) == expected, op.name
    assert (not wire_schema.errors("v1", without)) == (expected is None), op.name
    # An explicit null is the same as no session_id.
    null = {**without, "session_id": None}
    assert service_verdict(routes, null) == expected, op.name


def test_semantic_checks_are_not_shape(routes: dict[str, Route]) -> None:
    """Shape-valid payloads the service still refuses, as the reference documents."""
    op = v1.operation("initialize")
    payload = {"supported_protocol_versions": [2]}
    assert not wire_schema.errors("request.initialize", payload)
    assert service_verdict(routes, record_for(op, payload)) == ErrorCode.UNSUPPORTED_VERSION


def test_integers_with_a_fraction_are_refused_though_json_schema_allows_them(
    routes: dict[str, Route],
) -> None:
    """JSON Schema counts ``1.0`` as an integer; the service does not (documented)."""
    op = v1.operation("session.list")
    assert not wire_schema.errors("request.session.list", {"limit": 1.0})
    assert service_verdict(routes, record_for(op, {"limit": 1.0})) == ErrorCode.INVALID_PAYLOAD


def test_case_generation_is_not_vacuous() -> None:
    total = {op.name: list(cases(op)) for op in v1.OPERATIONS}
    assert sum(len(c) for c in total.values()) > 500
    set_cases = total["config.set"]
    assert any(c.code is ErrorCode.INVALID_SCOPE for c in set_cases)
    assert any(c.code is ErrorCode.LIMIT_EXCEEDED for c in total["session.list"])
    assert any(c.code is ErrorCode.INVALID_SESSION_ID for c in total["session.list"])
    assert any(c.label.endswith("(checked late)") for c in total["auth.login.callback"])
