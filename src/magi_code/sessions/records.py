"""Session history record codec (pure, no I/O).

One history line is one compact JSON object terminated by ``\\n``::

    {"v":1,"seq":3,"ts":"2025-01-01T00:00:00.000Z","type":"user","turn_id":"t1","text":"hi"}

``v`` is the schema version, ``seq`` a per-session monotonic integer (the header is 0) and
``type`` selects the remaining fields (see ``FIELDS``, and ``OPTIONAL_FIELDS`` for fields a
record may carry or leave out; records written before an optional field existed simply
lack it). Decoding never raises: a line that is not a valid record of this version decodes
to ``None`` so readers can skip it and report a gap. Unknown ``type`` values decode to
``UnknownRecord`` (forward compatibility).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, Literal

import orjson

from magi_code.dataclass import dataclass
from magi_code.protocol.idempotency import valid_idempotency_key

RECORD_VERSION: Final = 1

TerminalStatus = Literal["completed", "cancelled", "failed", "compaction_required"]

# Fields per known type (besides v/seq/ts/type); decoding and encoding check the types.
FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "header": ("session_id", "created_at"),
    "user": ("turn_id", "text"),
    "assistant": ("turn_id", "text"),
    "tool_call": ("turn_id", "call_id", "name", "arguments"),
    "tool_result": ("turn_id", "call_id", "name", "output", "is_error"),
    "terminal": ("turn_id", "status", "assistant_text"),
    "compaction": ("summary", "cutoff_seq"),
    # A tool call's approval (``core.approvals``): written when asked (``decision``
    # ``pending``) and when settled (the same ``approval_id``). The v1 replay projection,
    # an allowlist, never shows it; the v2 watch history does (``projection.history_after``).
    "approval": ("turn_id", "approval_id", "kind", "decision"),
    # A file a turn's tool changed (``checkpoints``): its project root and path in it, and
    # the SHA-256 of its content before and after (``""``: no file). Decoded as an
    # ``UnknownRecord``: replay never shows it; a rewind reads it (``rewind``).
    "file_change": ("turn_id", "root", "path", "before", "after"),
    # ``session.rewind`` (RFC-0002 §6.16): the records after ``to_seq`` (up to this one)
    # are no longer the conversation (``rewind.effective``); they stay in the file.
    "rewind": ("to_seq",),
}
# Fields a record of that type may carry or omit. Encoding omits one whose value is None;
# a present field must be valid (a bad value makes the whole line malformed).
OPTIONAL_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    # The client's turn.start idempotency key (see ``valid_idempotency_key``).
    # ``steer``: ``true`` on text the controller sent into the running turn (RFC-0002
    # §6.10), where it entered; the turn's first user record (its prompt) has none.
    "user": ("idempotency_key", "steer"),
    # The sequence number the turn's terminal event carried (absent when no event did);
    # a failed turn's ``failure`` label and ``remedy`` (``turns/failures.py``; absent on
    # other terminals, and on those of versions that did not record them).
    "terminal": ("sequence", "failure", "remedy"),
    # ``continued``: ``true`` on an increment of a reply still streaming: the reply's
    # message continues in the turn's next assistant record (absent on the record that
    # ends it). ``truncated``: ``true`` on the record that ends a reply the provider's
    # output-token limit still cut after the automatic continuations (its text may stop
    # mid-sentence); such a record may have empty text. Replay shows neither.
    "assistant": ("continued", "truncated"),
    # ``subject``: the bounded command, path or MCP tool; ``by``: who answered.
    "approval": ("subject", "by"),
}
# Every field a record of that type may be given, ``type`` included.
_ALLOWED: Final[dict[str, frozenset[str]]] = {
    kind: frozenset(("type", *required, *OPTIONAL_FIELDS.get(kind, ())))
    for kind, required in FIELDS.items()
}
_STATUSES: Final[dict[str, TerminalStatus]] = {
    "completed": "completed",
    "cancelled": "cancelled",
    "failed": "failed",
    "compaction_required": "compaction_required",
}


@dataclass(frozen=True, slots=True)
class HeaderRecord:
    seq: int
    session_id: str
    created_at: str


@dataclass(frozen=True, slots=True)
class UserRecord:
    seq: int
    turn_id: str
    text: str
    idempotency_key: str | None = None
    steer: bool = False


@dataclass(frozen=True, slots=True)
class AssistantRecord:
    seq: int
    turn_id: str
    text: str
    continued: bool = False
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    seq: int
    turn_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolResultRecord:
    seq: int
    turn_id: str
    call_id: str
    name: str
    output: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class TerminalRecord:
    seq: int
    turn_id: str
    status: TerminalStatus
    assistant_text: str
    sequence: int | None = None
    failure: str | None = None
    remedy: str | None = None


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    seq: int
    summary: str
    cutoff_seq: int


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    seq: int
    turn_id: str
    approval_id: str
    kind: str
    decision: str
    subject: str | None = None
    by: str | None = None


@dataclass(frozen=True, slots=True)
class RewindRecord:
    seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class UnknownRecord:
    """A well-formed record of a type this version does not know; never projected."""

    seq: int
    type: str


Record = (
    HeaderRecord
    | UserRecord
    | AssistantRecord
    | ToolCallRecord
    | ToolResultRecord
    | TerminalRecord
    | CompactionRecord
    | ApprovalRecord
    | RewindRecord
    | UnknownRecord
)


def rfc3339_utc(moment: datetime) -> str:
    """``2025-01-01T00:00:00.000Z`` (millisecond precision, always UTC)."""
    return (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )


# The last whole second ``now_rfc3339`` formatted, and its text: a record is stamped
# with the time of its submission, and ``strftime`` cost more than encoding the record.
_second: tuple[int, str] = (-1, "")


def now_rfc3339() -> str:
    """``rfc3339_utc`` of now."""
    global _second
    seconds, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    known = _second
    if known[0] != seconds:
        known = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds)))
    return f"{known[1]}{nanoseconds // 1_000_000:03d}Z"


class _Malformed(Exception):
    """Internal: a known record type with missing or mistyped fields."""


def _str(obj: Mapping[str, object], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise _Malformed
    return value


def _shared(obj: Mapping[str, object], name: str, strings: dict[str, str] | None) -> str:
    """``_str``, as the equal string ``strings`` already holds (which it then keeps)."""
    value = _str(obj, name)
    return value if strings is None else strings.setdefault(value, value)


def _seq(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Malformed
    return value


def _key(obj: Mapping[str, object]) -> str | None:
    if "idempotency_key" not in obj:
        return None
    value = obj["idempotency_key"]
    if not valid_idempotency_key(value):
        raise _Malformed
    return value


def _flag(obj: Mapping[str, object], name: str) -> bool:
    value = obj.get(name, False)
    if not isinstance(value, bool):
        raise _Malformed
    return value


def _sequence(obj: Mapping[str, object]) -> int | None:
    return _seq(obj["sequence"]) if "sequence" in obj else None


def _optional_str(obj: Mapping[str, object], name: str) -> str | None:
    return _str(obj, name) if name in obj else None


def _build(
    kind: str, seq: int, obj: Mapping[str, object], strings: dict[str, str] | None = None
) -> Record:
    match kind:
        case "header":
            return HeaderRecord(seq, _str(obj, "session_id"), _str(obj, "created_at"))
        case "user":
            return UserRecord(
                seq,
                _shared(obj, "turn_id", strings),
                _shared(obj, "text", strings),
                _key(obj),
                _flag(obj, "steer"),
            )
        case "assistant":
            return AssistantRecord(
                seq,
                _shared(obj, "turn_id", strings),
                _shared(obj, "text", strings),
                _flag(obj, "continued"),
                _flag(obj, "truncated"),
            )
        case "tool_call":
            return ToolCallRecord(
                seq,
                _shared(obj, "turn_id", strings),
                _shared(obj, "call_id", strings),
                _shared(obj, "name", strings),
                _str(obj, "arguments"),
            )
        case "tool_result":
            is_error = obj.get("is_error")
            if not isinstance(is_error, bool):
                raise _Malformed
            return ToolResultRecord(
                seq,
                _shared(obj, "turn_id", strings),
                _shared(obj, "call_id", strings),
                _shared(obj, "name", strings),
                _str(obj, "output"),
                is_error,
            )
        case "terminal":
            status = _STATUSES.get(_str(obj, "status"))
            if status is None:
                raise _Malformed
            return TerminalRecord(
                seq,
                _shared(obj, "turn_id", strings),
                status,
                _shared(obj, "assistant_text", strings),  # often its one reply's text
                _sequence(obj),
                _optional_str(obj, "failure"),
                _optional_str(obj, "remedy"),
            )
        case "compaction":
            cutoff = _seq(obj.get("cutoff_seq"))
            # A checkpoint can only replace records written before it.
            if cutoff >= seq:
                raise _Malformed
            return CompactionRecord(seq, _str(obj, "summary"), cutoff)
        case "approval":
            return ApprovalRecord(
                seq,
                _shared(obj, "turn_id", strings),
                _str(obj, "approval_id"),
                _str(obj, "kind"),
                _str(obj, "decision"),
                _optional_str(obj, "subject"),
                _optional_str(obj, "by"),
            )
        case "rewind":
            to_seq = _seq(obj.get("to_seq"))
            if to_seq >= seq:  # a rewind goes back only
                raise _Malformed
            return RewindRecord(seq, to_seq)
        case _:
            return UnknownRecord(seq, kind)


def encode_record(fields: Mapping[str, object], seq: int, ts: str) -> bytes:
    """One complete history line (with ``\\n``) for a record of a known type.

    Optional fields (``OPTIONAL_FIELDS``) may be left out or set to ``None``; either way
    they are not written, so a record without them encodes exactly as before they existed.

    Raises:
        ValueError: unknown type, missing/mistyped/extra fields, or text that is not
            encodable (a caller bug, not a wire condition).
    """
    kind = fields.get("type")
    if not isinstance(kind, str) or kind not in FIELDS:
        raise ValueError("unknown record type")
    required = FIELDS[kind]
    if not fields.keys() <= _ALLOWED[kind]:
        raise ValueError("unexpected or missing record fields")
    obj: dict[str, object] = {"v": RECORD_VERSION, "seq": seq, "ts": ts, "type": kind}
    try:
        for name in required:
            obj[name] = fields[name]
    except KeyError:
        raise ValueError("unexpected or missing record fields") from None
    for name in OPTIONAL_FIELDS.get(kind, ()):
        value = fields.get(name)
        if value is not None:
            obj[name] = value
    try:
        _build(kind, _seq(seq), obj)
        return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
    except _Malformed as exc:
        raise ValueError("invalid record fields") from exc
    except orjson.JSONEncodeError as exc:
        raise ValueError("record is not encodable") from exc


def decode_line(line: bytes, strings: dict[str, str] | None = None) -> Record | None:
    """The record on one line (without its ``\\n``), or ``None`` when malformed.

    With ``strings``, its IDs, tool name and message text are the equal strings
    ``strings`` already holds (see ``_shared``): records decoded with one such mapping
    share one of each (a turn's ID, a call's, a reply and its terminal's copy of it).
    """
    decoded = decode_line_ts(line, strings)
    return None if decoded is None else decoded[0]


def decode_line_ts(
    line: bytes, strings: dict[str, str] | None = None
) -> tuple[Record, object] | None:
    """Like ``decode_line``, with the line's raw ``ts`` value (``None`` when absent).

    ``ts`` is informational and never checked by decoding; see ``parse_ts``.
    """
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or type(obj.get("v")) is not int or obj["v"] != RECORD_VERSION:
        return None
    kind = obj.get("type")
    if not isinstance(kind, str):
        return None
    try:
        return _build(kind, _seq(obj.get("seq")), obj, strings), obj.get("ts")
    except _Malformed:
        return None


def parse_ts(value: object) -> float | None:
    """A record's ``ts`` as Unix seconds, or ``None`` if it is not a zoned timestamp."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return None if moment.tzinfo is None else moment.timestamp()
