"""Envelope decoding: precedence of errors, identity extraction, bounds, encoding."""

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
    encode_batch,
    encode_message,
    event,
    response,
)
from magi_code.protocol.errors import MESSAGES, ErrorCode, ServiceError


def req(**fields: Any) -> bytes:
    record: dict[str, Any] = {
        "protocol_version": 1,
        "kind": "request",
        "request_id": "r1",
        "method": "status",
        "payload": {},
    }
    record.update(fields)
    return orjson.dumps({k: v for k, v in record.items() if v is not ...})


def decode(line: bytes, reserved: frozenset[str] = frozenset()) -> Request | Rejected:
    return decode_record(line, reserved.__contains__)


def test_valid_request_decodes() -> None:
    assert decode(req(session_id="s1")) == Request("r1", "s1", "status", {})


@pytest.mark.parametrize(
    ("line", "code", "identity"),
    [
        (b"", ErrorCode.INVALID_JSON, Identity()),
        (b"{", ErrorCode.INVALID_JSON, Identity()),
        (b"[1]", ErrorCode.INVALID_REQUEST, Identity()),
        (b"[" * 5000, ErrorCode.LIMIT_EXCEEDED, Identity()),
        (req(protocol_version=2), ErrorCode.UNSUPPORTED_VERSION, Identity("r1", None, "status")),
        (req(protocol_version=True), ErrorCode.INVALID_REQUEST, Identity("r1", None, "status")),
        (req(extra=1), ErrorCode.INVALID_REQUEST, Identity("r1", None, "status")),
        (req(kind="response"), ErrorCode.INVALID_REQUEST, Identity("r1", None, "status")),
        (req(request_id=...), ErrorCode.INVALID_REQUEST, Identity(None, None, "status")),
        (req(request_id=""), ErrorCode.INVALID_REQUEST, Identity(None, None, "status")),
        (req(request_id="x" * 129), ErrorCode.LIMIT_EXCEEDED, Identity(None, None, "status")),
        (req(method="m" * 65), ErrorCode.LIMIT_EXCEEDED, Identity("r1")),
        (req(method="Status!"), ErrorCode.UNSUPPORTED_OPERATION, Identity("r1")),
        (req(payload=...), ErrorCode.INVALID_REQUEST, Identity("r1", None, "status")),
        (req(payload=None), ErrorCode.INVALID_PAYLOAD, Identity("r1", None, "status")),
        (req(payload={"a": [0] * 65}), ErrorCode.LIMIT_EXCEEDED, Identity("r1", None, "status")),
        (
            req(payload={"a": "x" * 12000, "b": "x" * 12000, "c": "x" * 12000}),
            ErrorCode.PAYLOAD_TOO_LARGE,
            Identity("r1", None, "status"),
        ),
        (req(session_id="a\tb"), ErrorCode.INVALID_REQUEST, Identity("r1", None, "status")),
    ],
)
def test_rejections_carry_code_and_safe_identity(
    line: bytes, code: ErrorCode, identity: Identity
) -> None:
    result = decode(line)
    assert isinstance(result, Rejected)
    assert (result.code, result.identity) == (code, identity)
    assert not result.duplicate


def test_duplicate_check_precedes_decoder_errors() -> None:
    result = decode(req(extra=1, session_id="s9"), frozenset({"r1"}))
    assert isinstance(result, Rejected)
    assert result.code is ErrorCode.DUPLICATE_REQUEST_ID
    assert result.duplicate
    assert result.identity == Identity("r1", "s9", "status")


def test_error_messages_are_fixed_short_and_cover_every_code() -> None:
    assert set(MESSAGES) == set(ErrorCode)
    for code in ErrorCode:
        wire = ServiceError(code).to_wire()
        assert wire["code"] == code.value
        assert 0 < len(wire["message"].encode()) <= 512


def test_response_shape_has_every_slot() -> None:
    msg = response(Identity("r1", None, "status"), {"service": "ready"})
    assert msg == {
        "protocol_version": 1,
        "kind": "response",
        "request_id": "r1",
        "session_id": None,
        "method": "status",
        "payload": {"service": "ready"},
        "error": None,
    }
    failed = response(Identity(), {"ignored": 1}, ServiceError(ErrorCode.INVALID_JSON))
    assert failed["payload"] is None
    assert failed["error"]["code"] == "invalid_json"


def test_outbound_oversize_is_refused_whole() -> None:
    ok = event("e1", "r1", None, "turn.assistant_delta", {"text": "hi"})
    too_big = event("e2", "r1", None, "turn.assistant_delta", {"text": "x" * 20000})
    assert encode_message(ok).endswith(b"\n")
    with pytest.raises(OutboundError):
        encode_batch([ok, too_big])
    with pytest.raises(OutboundError):
        encode_message({"payload": {"bad": object()}})


def test_check_bounds_counts_depth_from_the_top_container() -> None:
    value: Any = []
    for _ in range(31):
        value = [value]
    check_bounds(value)  # 32 levels
    with pytest.raises(ServiceError):
        check_bounds([value])


# The decoder judges an envelope field by its type and a payload's size by its bounds
# (test_rejections_carry_code_and_safe_identity, test_envelope_short_lines): small values
# of every JSON type, nested a few levels, reach every verdict; larger ones only cost time.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=6,
)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoder(line: bytes) -> None:
    assert isinstance(decode(line), (Request, Rejected))


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.sampled_from(
            sorted(
                ["protocol_version", "kind", "request_id", "session_id", "method", "payload", "x"]
            )
        ),
        json_values,
    )
)
def test_wrong_types_in_every_field_are_rejected_or_valid(record: dict[str, Any]) -> None:
    result = decode(orjson.dumps(record))
    if isinstance(result, Request):
        assert record["protocol_version"] == 1 and record["kind"] == "request"
        assert isinstance(record["payload"], dict)
    else:
        assert result.code in set(ErrorCode)
