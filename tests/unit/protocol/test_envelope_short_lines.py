"""The short-line shortcut (a record or answer whose line proves every bound holds skips
the structural walk) gives exactly the walk's verdicts.

Each case is decided twice: by ``decode_record`` / ``encode_message`` and by a reference
that always walks (``check_bounds`` plus the compact payload size), on values built to sit
at and just past each limit, and on random values.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magi_code.protocol.bounds import check_bounds
from magi_code.protocol.envelope import (
    Identity,
    OutboundError,
    Rejected,
    Request,
    decode_record,
    encode_message,
    response,
)
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import (
    MAX_ARRAY_ITEMS,
    MAX_JSON_DEPTH,
    MAX_OBJECT_FIELDS,
    MAX_PAYLOAD_BYTES,
    MAX_STRING_BYTES,
)


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _record(payload: Any, **extra: Any) -> dict[str, Any]:
    return {"protocol_version": 1, "kind": "request", "request_id": "r", "method": "status",
            "payload": payload, **extra}  # fmt: skip


def _reference_inbound(record: Any) -> ErrorCode | None:
    """What the full walk says about a decoded record's bounds and payload size."""
    try:
        check_bounds(record)
    except ServiceError as exc:
        return exc.code
    payload = record.get("payload")
    if isinstance(payload, dict) and len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
        return ErrorCode.PAYLOAD_TOO_LARGE
    return None


def _inbound(line: bytes) -> ErrorCode | None:
    result = decode_record(line, lambda _rid: False)
    if isinstance(result, Rejected):
        return result.code
    assert isinstance(result, Request)
    return None


CASES: list[tuple[str, Any]] = [
    ("items at the limit", {"a": list(range(MAX_ARRAY_ITEMS))}),
    ("items over the limit", {"a": list(range(MAX_ARRAY_ITEMS + 1))}),
    ("fields at the limit", {f"k{i}": 0 for i in range(MAX_OBJECT_FIELDS - 6)}),
    ("fields over the limit", {f"k{i}": 0 for i in range(MAX_OBJECT_FIELDS + 1)}),
    ("depth at the limit", {"a": _nested(MAX_JSON_DEPTH - 2)}),
    ("depth over the limit", {"a": _nested(MAX_JSON_DEPTH - 1)}),
    ("string at the limit", {"a": "x" * (MAX_STRING_BYTES - 200)}),
    ("string over the limit", {"a": "x" * (MAX_STRING_BYTES + 1)}),
    ("multi-byte string over the limit", {"a": "\u00e9" * (MAX_STRING_BYTES // 2 + 1)}),
    ("key over the limit", {"k" * (MAX_STRING_BYTES + 1): 0}),
    ("floats that grow when re-encoded", {"a": [1e15] * 60}),
    ("empty payload", {}),
]


@pytest.mark.parametrize(("name", "payload"), CASES, ids=[c[0] for c in CASES])
def test_inbound_verdicts_match_the_walk(name: str, payload: Any) -> None:
    record = _record(payload)
    line = orjson.dumps(record)
    assert _inbound(line) == _reference_inbound(record), name


def test_a_short_line_of_escapes_that_decodes_long_is_still_walked() -> None:
    # 6-byte escapes decode to 1 byte each: the line stays short, the string is not long.
    text = "\\u0061" * 2000
    line = orjson.dumps(_record({"a": "PLACE"})).replace(b"PLACE", text.encode())
    assert _inbound(line) is None
    # Commas and brackets inside strings only make the line look bigger, never smaller.
    tricky = _record({"a": "[[[[,,,,{{{{" * 20})
    assert _inbound(orjson.dumps(tricky)) == _reference_inbound(tricky)


def test_short_numbers_that_grow_stay_within_the_payload_limit() -> None:
    # The most a short line's payload can grow: every number re-encoded much longer.
    line = b'{"protocol_version":1,"kind":"request","request_id":"r","method":"m","payload":{'
    line += b",".join(b'"%d":[1e15]' % i for i in range(MAX_OBJECT_FIELDS - 8)) + b"}}"
    record = orjson.loads(line)
    assert _inbound(line) == _reference_inbound(record) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False,
    allow_infinity=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=70)
    | st.dictionaries(st.text(max_size=8), children, max_size=70),
    max_leaves=120,
)  # fmt: skip


def _reference_outbound(message: dict[str, Any]) -> bool:
    try:
        check_bounds(message)
    except ServiceError:
        return False
    payload = message.get("payload")
    if payload is not None and len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
        return False
    return len(orjson.dumps(message)) + 1 <= 65536


def _outbound(message: dict[str, Any]) -> bool:
    try:
        line = encode_message(message)
    except OutboundError:
        return False
    assert line == orjson.dumps(message) + b"\n"
    return True


@pytest.mark.parametrize(("name", "payload"), CASES, ids=[c[0] for c in CASES])
def test_outbound_verdicts_match_the_walk(name: str, payload: Any) -> None:
    message = response(Identity("r", None, "status"), payload)
    assert _outbound(message) == _reference_outbound(message), name


# Generating a value costs far more than deciding it, so each value is decided both ways:
# as a request's payload and as an answer's.
@settings(max_examples=300)
@given(json_values)
def test_random_payloads_and_answers_get_the_walks_verdict(value: Any) -> None:
    record = _record({"v": value})
    assert _inbound(orjson.dumps(record)) == _reference_inbound(record)
    message = response(Identity("r", None, "status"), {"v": value})
    assert _outbound(message) == _reference_outbound(message)
