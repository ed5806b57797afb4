"""The request checks derived from the declarations (``protocol/payloads.py``) against the
generated JSON Schemas, as properties, and the order of their errors.

For every operation, requests drawn from its declared shape (near-valid values, values
at and past every bound, wrong types, missing and unknown members, any outer
``session_id``) go through the service's inbound path (envelope decoding, the route's
session rule, the route's checks) and through the ``v1`` bundle: the service accepts a
request exactly when the bundle does. Where they are known to differ, each case is
documented in ``test_schema_requests.py`` (integers with a zero fraction, constraints
an operation's handler checks) or below (a trailing newline before a pattern's ``$``),
and left out of the draw.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magi_code.core.routes import Route
from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.schema import definitions as v1
from magi_code.protocol.schema.model import Arr, Bool, Int, Nullable, Obj, Shape, Str
from tests.support import wire_schema
from tests.unit.protocol.test_schema_requests import record_for, routes, service_verdict

__all__ = ["routes"]

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([1.5, -0.5]),  # never a float with a zero fraction (documented)
    st.text(max_size=3),
)
ANYTHING = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
# Strings never end in a newline: JSON Schema's ``$`` matches before one (documented).
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=6)


def _sized(limit: int) -> st.SearchStrategy[str]:
    """Strings of ASCII and two-byte characters around a bound of ``limit``."""
    lengths = st.sampled_from([0, 1, limit // 2, limit // 2 + 1, limit - 1, limit, limit + 1])
    return st.builds(lambda n, c: c * n, lengths, st.sampled_from(["a", "é", " "]))


def strings(shape: Str) -> st.SearchStrategy[str]:
    options = [TEXT, st.sampled_from(["", " ", "\t", "\u3000x", "a.b", "-x"])]
    if shape.enum is not None:
        options.append(st.sampled_from(shape.enum))
    if shape.pattern is not None:
        options.append(st.from_regex(shape.pattern, fullmatch=True).filter(str.isprintable))
    for limit in (shape.max_bytes, shape.max_length, shape.min_length):
        if limit:
            options.append(_sized(limit))
    return st.one_of(options)


def values(shape: Shape) -> st.SearchStrategy[Any]:
    """Values near ``shape`` (mostly of its type, some valid) or any JSON value."""
    if isinstance(shape, Nullable):
        return st.one_of(st.none(), values(shape.inner))
    if isinstance(shape, Str):
        own: st.SearchStrategy[Any] = strings(shape)
    elif isinstance(shape, Int):
        low = -2 if shape.minimum is None else shape.minimum - 2
        high = 2 if shape.maximum is None else shape.maximum + 2
        own = st.one_of(st.integers(low, low + 4), st.integers(high - 4, high))
    elif isinstance(shape, Bool):
        own = st.booleans()
    elif isinstance(shape, Arr):
        most = 3 if shape.max_items is None else shape.max_items + 1
        own = st.lists(values(shape.items), max_size=most)
    elif isinstance(shape, Obj):
        own = objects(shape)
    else:
        raise AssertionError(shape)
    return st.one_of(own, own, ANYTHING)


def objects(shape: Obj) -> st.SearchStrategy[dict[str, Any]]:
    members = {f.name: values(f.shape) for f in shape.fields}
    required = {f.name: members[f.name] for f in shape.fields if f.required}
    optional = {f.name: members[f.name] for f in shape.fields if not f.required}
    complete = st.fixed_dictionaries(required, optional=optional)
    # Required members may be missing, and an unknown member may come along.
    partial = st.fixed_dictionaries({}, optional={**members, "zz_unknown": SCALARS})
    return st.one_of(complete, complete, partial)


# Built once: building a strategy (regexes above all) costs more than drawing from it.
SESSION_IDS = st.one_of(
    st.none(),
    st.from_regex(v1.SESSION_ID_PATTERN, fullmatch=True).filter(lambda s: len(s) <= 128),
    st.sampled_from(["a.b", "-x", "ses é", "ses_a"]),
)


@functools.cache
def payloads(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """The payloads drawn for the operation ``name``, built once."""
    return objects(next(op for op in v1.OPERATIONS if op.name == name).request)


def late_only(op: v1.Operation, payload: Any) -> bool:
    """Every schema error of ``payload`` is one its operation's handler checks (``late``)."""
    keywords = {"min_length": {"minLength"}, "max_bytes": {"maxLength", "x-max-utf8-bytes"}}
    late = {
        f.name: set().union(*(keywords[c] for c in f.shape.late))
        for f in op.request.fields
        if f.shape.late
    }
    found = wire_schema.errors(f"request.{op.name}", payload)
    return bool(found) and all(
        len(e.path) == 1 and e.validator in late.get(e.path[0], set()) for e in found
    )


@pytest.mark.parametrize("op", v1.OPERATIONS, ids=lambda op: op.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_service_accepts_a_request_exactly_when_the_schema_does(
    op: v1.Operation, routes: dict[str, Route], data: st.DataObject
) -> None:
    payload = data.draw(payloads(op.name), label="payload")
    session_id = data.draw(SESSION_IDS, label="session_id")
    record = record_for(op, payload, session_id)
    if session_id is None:
        record.pop("session_id", None)
    got = service_verdict(routes, record)
    schema_valid = not wire_schema.errors("v1", record)
    # Checks the schema cannot express (``initialize`` must offer version 1).
    shape_valid = got in (None, ErrorCode.UNSUPPORTED_VERSION)
    if shape_valid and not schema_valid and late_only(op, payload):
        return
    assert shape_valid == schema_valid, (op.name, record, got)


# Requests that break several rules: the first failing check decides, in the order the
# declarations give (``docs/protocol/envelope.md``, "the operation's payload rules").
ORDERED = [
    # Members by member, in declared order unless declared otherwise.
    (
        "initialize",
        None,
        {"supported_protocol_versions": [], "requested_capabilities": 5},
        "limit_exceeded",
    ),
    ("auth.login.callback", None, {"login_id": "x" * 200, "input": 5}, "limit_exceeded"),
    ("auth.logout", None, {"provider_id": "", "confirmed": 1, "x": 1}, "invalid_payload"),
    # ``session.list`` and ``session.replay`` check ``limit`` before ``after``.
    ("session.list", None, {"after": 5, "limit": 100}, "limit_exceeded"),
    ("session.replay", "ses_a", {"after": 5, "limit": 100}, "limit_exceeded"),
    # An operation's own code comes after every structural check.
    ("session.list", None, {"after": "a.b", "limit": 0}, "invalid_payload"),
    ("config.set", None, {"scope": "nowhere"}, "invalid_payload"),
    ("config.set", None, {"scope": "nowhere", "thinking_level": "zz"}, "invalid_payload"),
    ("config.set", None, {"scope": "nowhere", "fast": True}, "invalid_scope"),
    ("session.open", "a.b", {"x": 1}, "invalid_payload"),
    ("turn.start", "a.b", {"prompt": " "}, "invalid_payload"),
    ("turn.start", "a.b", {"prompt": "hi"}, "invalid_session_id"),
    # ...except ``session.replay``'s outer session ID, checked first.
    ("session.replay", "a.b", {"limit": 0}, "invalid_session_id"),
    # Catalog pages: every member's type, then every minimum, then every maximum.
    ("catalog.providers", None, {"offset": 200_000, "limit": 0}, "invalid_payload"),
    ("catalog.providers", None, {"offset": -1, "limit": 100}, "invalid_payload"),
    (
        "catalog.models",
        None,
        {"offset": 200_000, "limit": None, "provider_id": "a"},
        "invalid_payload",
    ),
    ("catalog.models", None, {"offset": 200_000}, "invalid_payload"),
    # A check the shape cannot express comes after the shape's.
    ("initialize", None, {"supported_protocol_versions": [2], "x": 1}, "invalid_payload"),
    ("initialize", None, {"supported_protocol_versions": [2]}, "unsupported_version"),
]


@pytest.mark.parametrize(("method", "session_id", "payload", "code"), ORDERED)
def test_the_first_failing_check_decides(
    routes: dict[str, Route], method: str, session_id: str | None, payload: Any, code: str
) -> None:
    record = record_for(v1.operation(method), payload, session_id)
    assert service_verdict(routes, record) == ErrorCode(code)


def test_a_trailing_newline_passes_the_schemas_pattern_but_not_the_service(
    routes: dict[str, Route],
) -> None:
    """JSON Schema's ``$`` matches before a final newline; the service matches whole
    strings (documented)."""
    op = v1.operation("session.list")
    assert not wire_schema.errors("request.session.list", {"after": "ses_a\n"})
    verdict = service_verdict(routes, record_for(op, {"after": "ses_a\n"}))
    assert verdict == ErrorCode.INVALID_SESSION_ID
