"""v1 envelopes: decode one inbound record, build and encode outbound messages.

Theory of operation (inbound), in the order the spec makes observable:

1. the adapter has already enforced the record limit and stripped LF/CRLF;
2. bytes that are not JSON (or blank) -> ``invalid_json``, uncorrelated;
3. a non-object -> ``invalid_request``, uncorrelated;
4. identity fields are extracted independently, each only if safe;
5. a safe ``request_id`` that is reserved -> ``duplicate_request_id`` (before any other
   decoder error, leaving the original reservation untouched);
6. structural limits, envelope fields, version, payload size;
7. the coordinator then validates the method's payload and the initialization gate.

A rejected record with a fresh safe request ID keeps that ID reserved until its error
response is written, exactly like an accepted synchronous request.

Short lines skip the structural walk (inbound and outbound alike) when the line itself
proves every bound holds (:func:`_within_bounds`): most records and answers are a few
hundred bytes, and the walk would cost more than parsing them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from magi_code.dataclass import dataclass

from .bounds import check_bounds, string_fits
from .errors import ErrorCode, ServiceError
from .limits import (
    MAX_ARRAY_ITEMS,
    MAX_ID_BYTES,
    MAX_JSON_DEPTH,
    MAX_NAME_BYTES,
    MAX_OBJECT_FIELDS,
    MAX_PAYLOAD_BYTES,
    MAX_RECORD_BYTES,
    MAX_STRING_BYTES,
    PROTOCOL_VERSION,
)

if TYPE_CHECKING:
    from .v2 import McpServer

ENVELOPE_FIELDS: Final = frozenset(
    {"protocol_version", "kind", "request_id", "session_id", "method", "payload"}
)
_METHOD_RE: Final = re.compile(r"[a-z][a-z0-9_.]*\Z")
# A line with fewer commas than this has no array or object with too many members.
_MAX_COMMAS: Final = min(MAX_ARRAY_ITEMS, MAX_OBJECT_FIELDS)
# No string in a line this short can be over the string limit.
_SHORT_LINE: Final = MAX_STRING_BYTES


def _within_bounds(line: bytes) -> bool:
    """Whether the JSON text ``line`` provably meets every structural bound and the payload
    limit, from counts alone. No string or key decodes to more UTF-8 bytes than the line
    has (an escape is never shorter than what it stands for); a container of n members
    needs n - 1 commas; nesting d containers deep needs d opening brackets. Brackets and
    commas inside strings only make the counts larger, so ``True`` is always right and
    ``False`` means "walk the value" (:func:`check_bounds`). The compact payload is at most
    the line plus what its numbers gain when re-encoded: strings never grow, and each of at
    most 64 + 32 numbers grows by at most 23 bytes (``1e15`` -> ``1000000000000000.0``),
    far below the 16 KiB between the short-line and the payload limits."""
    return (
        len(line) <= _SHORT_LINE
        and line.count(b",") < _MAX_COMMAS
        and line.count(b"{") + line.count(b"[") <= MAX_JSON_DEPTH
    )


@dataclass(frozen=True, slots=True)
class Identity:
    request_id: str | None = None
    session_id: str | None = None
    method: str | None = None


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    session_id: str | None
    method: str
    payload: dict[str, Any]
    # v2 ``request`` frames may name the request for safe retries (turn.start).
    idempotency_key: str | None = None
    # and give it a deadline (Unix time in ms), checked again where admission waits.
    deadline_ms: int | None = None
    # A session.create/session.open's MCP servers for the session (RFC-0002 §6.13).
    mcp_servers: tuple[McpServer, ...] | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    code: ErrorCode
    identity: Identity
    duplicate: bool = False


def is_safe_id(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_BYTES
        and value.isprintable()
        and string_fits(value, MAX_ID_BYTES)
    )


def is_safe_name(value: object) -> bool:
    return isinstance(value, str) and len(value) <= MAX_NAME_BYTES and bool(_METHOD_RE.match(value))


def extract_identity(record: dict[str, Any]) -> Identity:
    request_id = record.get("request_id")
    session_id = record.get("session_id")
    method = record.get("method")
    return Identity(
        request_id=request_id if is_safe_id(request_id) else None,
        session_id=session_id if is_safe_id(session_id) else None,
        method=method if is_safe_name(method) else None,
    )


def decode_record(line: bytes, is_reserved: Any) -> Request | Rejected:
    """Decode one record (without its line ending). ``is_reserved(request_id) -> bool``."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        # orjson refuses nesting past its own recursion bound: that is a depth limit.
        if "depth limit" in str(exc):
            return Rejected(ErrorCode.LIMIT_EXCEEDED, Identity())
        return Rejected(ErrorCode.INVALID_JSON, Identity())
    return decode_object(record, is_reserved, measured=True, bounded=_within_bounds(line))


def decode_object(
    record: object, is_reserved: Any, *, measured: bool = False, bounded: bool = False
) -> Request | Rejected:
    """Validate a record a transport already decoded (a v2 ``request`` message).

    Unless ``measured`` (it came from a bounded line), its encoded size is checked against
    the record bound first, and a value JSON cannot carry is ``invalid_json``. ``bounded``
    (its line was shown to meet every structural bound) skips the structural walk.
    """
    if not isinstance(record, dict):
        return Rejected(ErrorCode.INVALID_REQUEST, Identity())
    if not measured:
        try:
            size = len(orjson.dumps(record)) + 1  # with its line feed, as on stdio
        except TypeError:
            return Rejected(ErrorCode.INVALID_JSON, Identity())
        if size > MAX_RECORD_BYTES:
            return Rejected(ErrorCode.RECORD_TOO_LARGE, Identity())
    identity = extract_identity(record)
    if identity.request_id is not None and is_reserved(identity.request_id):
        return Rejected(ErrorCode.DUPLICATE_REQUEST_ID, identity, duplicate=True)
    try:
        return _validate_envelope(record, identity, bounded)
    except ServiceError as exc:
        return Rejected(exc.code, identity)


def check_id_bytes(value: str) -> str:
    """``value`` if it is within the ID bound, which every ID field of a request shares
    (envelope and payload alike); ``limit_exceeded`` past it."""
    if not string_fits(value, MAX_ID_BYTES):
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    return value


def _id_field(value: object, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    check_id_bytes(value)
    if not value or not value.isprintable():
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    return value


def _validate_envelope(record: dict[str, Any], identity: Identity, bounded: bool) -> Request:
    if not bounded:
        check_bounds(record)
    version = record.get("protocol_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    if version != PROTOCOL_VERSION:
        raise ServiceError(ErrorCode.UNSUPPORTED_VERSION)
    if not ENVELOPE_FIELDS.issuperset(record):
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    if record.get("kind") != "request":
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    # A field the identity already found safe passes its own checks unchanged.
    request_id = identity.request_id or _id_field(record.get("request_id"), required=True)
    assert request_id is not None
    method = identity.method or record.get("method")
    if not isinstance(method, str):
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    if identity.method is None:
        if not string_fits(method, MAX_NAME_BYTES):
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
        if not is_safe_name(method):
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
    session_id = identity.session_id or _id_field(record.get("session_id"), required=False)
    if "payload" not in record:
        raise ServiceError(ErrorCode.INVALID_REQUEST)
    payload = record["payload"]
    if not isinstance(payload, dict):
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    if payload and not bounded and len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
        raise ServiceError(ErrorCode.PAYLOAD_TOO_LARGE)
    return Request(request_id, session_id, method, payload)


def request(
    request_id: str,
    method: str,
    payload: Mapping[str, Any] | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """A v1 request record as a client sends it (``session_id`` only when given)."""
    record: dict[str, Any] = {
        "protocol_version": PROTOCOL_VERSION,
        "kind": "request",
        "request_id": request_id,
        "method": method,
        "payload": dict(payload or {}),
    }
    if session_id is not None:
        record["session_id"] = session_id
    return record


def response(
    identity: Identity,
    payload: dict[str, Any] | None = None,
    error: ServiceError | None = None,
) -> dict[str, Any]:
    return {
        "protocol_version": PROTOCOL_VERSION,
        "kind": "response",
        "request_id": identity.request_id,
        "session_id": identity.session_id,
        "method": identity.method,
        "payload": payload if error is None else None,
        "error": error.to_wire() if error is not None else None,
    }


def event(
    event_id: str,
    request_id: str | None,
    session_id: str | None,
    name: str,
    payload: dict[str, Any],
) -> dict[str, Any]:
    return {
        "protocol_version": PROTOCOL_VERSION,
        "kind": "event",
        "event_id": event_id,
        "request_id": request_id,
        "session_id": session_id,
        "event": name,
        "payload": payload,
    }


class OutboundError(Exception):
    """An outbound message broke a bound or could not be encoded: the adapter must stop."""


def encode_message(message: dict[str, Any]) -> bytes:
    """One validated JSONL line (with its newline)."""
    try:
        line = orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        line = None  # checked below, bounds first, as for any other message
    if line is not None and _within_bounds(line):
        return line  # the payload is part of the line: within its limit too
    try:
        check_bounds(message)
        payload = message.get("payload")
        if payload is not None and len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
            raise OutboundError("outbound payload exceeds the payload limit")
        if line is None:
            line = orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)
    except ServiceError as exc:
        raise OutboundError("outbound message exceeds a structural limit") from exc
    except TypeError as exc:
        raise OutboundError("outbound message could not be encoded") from exc
    if len(line) > MAX_RECORD_BYTES:
        raise OutboundError("outbound record exceeds the record limit")
    return line


def encode_batch(messages: list[dict[str, Any]]) -> bytes:
    """Encode every message before anything is written (all or nothing)."""
    return b"".join(encode_message(m) for m in messages)
