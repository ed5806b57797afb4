"""A reference consumer of the v1 stdio stream: what a client must check, and tolerate.

:class:`V1StreamValidator` follows one client's side of a ``magi-code --app service``
conversation. Tell it what the client wrote (:meth:`~V1StreamValidator.sent` for a
request object, :meth:`~V1StreamValidator.sent_bytes` for raw bytes, framed the way the
service frames them), and hand it every line the service writes
(:meth:`~V1StreamValidator.receive`). A line that breaks the protocol raises
:class:`StreamViolation` *before the validator's state changes*: the stream is then
known to be broken, and what was accepted before stays exactly as it was.

It rejects what a v1 consumer cannot interpret safely (``docs/protocol/``):

- a record over 65,536 bytes with its newline, without its newline, not UTF-8 JSON, not
  an object; any structural bound broken (depth 32, 64 items, 64 members, strings and
  keys of 16,384 bytes, IDs of 128 bytes, names of 64 bytes, a payload of 32,768 bytes,
  an error message of 512 bytes);
- ``protocol_version`` other than 1, a ``kind`` other than ``response``/``event``, a
  missing or mistyped envelope member, a response with both or neither of ``payload`` and
  ``error``;
- a response whose ``request_id`` the client has no request in flight for, or whose
  ``method``/``session_id`` differ from that request's;
- per turn: ``turn.started`` not directly after its acceptance, sequences that repeat or
  go backwards, a terminal whose skipped sequence numbers differ from its
  ``activity_dropped`` or whose text differs from the deltas, an unknown terminal status,
  and any event of the turn after its terminal (a second terminal included); the same
  for a login's events.

It tolerates what later v1 services may add: unknown members anywhere, unknown events
(ignored whole), unknown activity kinds and values of open enumerations (activity
categories and statuses, sources, login states, error codes, ...), and optional members.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

import orjson

from magi_code.dataclass import dataclass, field
from magi_code.protocol.bounds import check_bounds, string_fits
from magi_code.protocol.errors import ServiceError
from magi_code.protocol.limits import (
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ID_BYTES,
    MAX_NAME_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_RECORD_BYTES,
    PROTOCOL_VERSION,
)

TURN_EVENTS: Final = frozenset(
    {"turn.started", "turn.assistant_delta", "turn.activity", "turn.terminal"}
)
LOGIN_EVENTS: Final = frozenset({"auth.login.progress", "auth.login.terminal"})
TERMINAL_STATUSES: Final = frozenset({"completed", "cancelled", "failed"})
_RESPONSE_MEMBERS: Final = ("request_id", "session_id", "method", "payload", "error")
_EVENT_MEMBERS: Final = ("event_id", "request_id", "session_id", "event", "payload")
# Finished streams remembered only to explain a late event (bounded).
_REMEMBERED: Final = 64


class StreamViolation(Exception):
    """The service broke the v1 protocol; ``reason`` is a stable label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Pending:
    """A request in flight, as the service will echo it."""

    method: str | None
    session_id: str | None


@dataclass(frozen=True, slots=True)
class TurnStream:
    turn_id: str
    session_id: str
    started: bool = False
    last_sequence: int = 0
    skipped: int = 0
    text: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoginStream:
    login_id: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the validator knows, comparable (tests check it is unchanged)."""

    pending: tuple[tuple[str, tuple[Pending, ...]], ...]
    turns: tuple[tuple[str, TurnStream], ...]
    logins: tuple[tuple[str, LoginStream], ...]
    expect_started: str | None
    finished: tuple[tuple[str, str], ...]
    received: int


def is_safe_id(value: object) -> bool:
    """What the service echoes as a request or session ID (else it answers ``null``)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_BYTES
        and value.isprintable()
        and string_fits(value, MAX_ID_BYTES)
    )


def is_safe_name(value: object) -> bool:
    """What the service echoes as a method name."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_BYTES:
        return False
    if not ("a" <= value[0] <= "z"):
        return False
    return all(c.isascii() and (c.islower() or c.isdigit() or c in "_.") for c in value)


def _fail(reason: str, detail: str) -> StreamViolation:
    return StreamViolation(reason, detail)


def _nothing() -> None:
    return None


def _string(
    value: object,
    what: str,
    *,
    limit: int | None = None,
    empty: bool = True,
    reason: str = "invalid_payload",
) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise _fail(
            reason, f"{what} is not a non-empty string" if not empty else f"{what} is not a string"
        )
    if limit is not None and not string_fits(value, limit):
        raise _fail("limit_exceeded", f"{what} is over {limit} bytes")
    return value


def _optional_id(value: object, what: str) -> str | None:
    if value is None:
        return None
    return _string(value, what, limit=MAX_ID_BYTES, empty=False, reason="invalid_envelope")


def _integer(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail("invalid_payload", f"{what} is not an integer")
    return value


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail("invalid_payload", f"{what} is not an object")
    return value


@dataclass(slots=True)
class _State:
    pending: dict[str, tuple[Pending, ...]] = field(default_factory=dict)
    turns: dict[str, TurnStream] = field(default_factory=dict)
    logins: dict[str, LoginStream] = field(default_factory=dict)
    expect_started: str | None = None
    finished: dict[str, str] = field(default_factory=dict)
    received: int = 0


class V1StreamValidator:
    """One client's view of a v1 service's output; see the module docstring."""

    def __init__(self) -> None:
        self._state = _State()
        self._unsent = bytearray()
        self._discarding = False

    # -- what the client wrote -----------------------------------------------------------

    def sent(self, record: Mapping[str, Any]) -> None:
        """A request object the client wrote as one compact JSON line."""
        try:
            size = len(orjson.dumps(record)) + 1
        except TypeError:
            return
        if size <= MAX_RECORD_BYTES:
            self._expect(record)

    def sent_bytes(self, data: bytes) -> None:
        """Raw bytes the client wrote: split into records exactly as the service does."""
        self._unsent += data
        while (newline := self._unsent.find(b"\n")) >= 0:
            line = bytes(self._unsent[:newline])
            del self._unsent[: newline + 1]
            if self._discarding:
                self._discarding = False  # the rest of an over-long record
            elif len(line) + 1 <= MAX_RECORD_BYTES:
                self._sent_line(line)
        if len(self._unsent) >= MAX_RECORD_BYTES:
            self._unsent.clear()
            self._discarding = True  # answered record_too_large, uncorrelated

    def sent_eof(self) -> None:
        """The client closed its output: a last record without a newline still counts."""
        if self._unsent and not self._discarding:
            self._sent_line(bytes(self._unsent))
        self._unsent.clear()
        self._discarding = False

    def _sent_line(self, line: bytes) -> None:
        line = line.removesuffix(b"\r")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return  # answered invalid_json (or limit_exceeded), uncorrelated
        if isinstance(record, dict):
            self._expect(record)

    def _expect(self, record: Mapping[str, Any]) -> None:
        request_id = record.get("request_id")
        if not is_safe_id(request_id):
            return  # its answer is uncorrelated
        assert isinstance(request_id, str)
        method = record.get("method")
        session_id = record.get("session_id")
        pending = Pending(
            method if is_safe_name(method) else None,
            session_id if is_safe_id(session_id) else None,
        )
        self._state.pending[request_id] = (*self._state.pending.get(request_id, ()), pending)

    # -- what the service wrote ----------------------------------------------------------

    def receive(self, line: bytes) -> dict[str, Any]:
        """Check one line the service wrote (with its newline); the decoded record.

        Raises:
            StreamViolation: the line breaks the protocol; nothing was changed.
        """
        record = self._decode(line)
        kind = record.get("kind")
        if kind == "response":
            apply = self._response(record)
        elif kind == "event":
            apply = self._event(record)
        else:
            raise _fail("unknown_kind", f"kind {kind!r} is not response or event")
        apply()
        self._state.received += 1
        return record

    def finish(self) -> None:
        """The service's output ended: every request answered, every stream terminated.

        Raises:
            StreamViolation: something is still open (nothing is changed).
        """
        state = self._state
        if state.expect_started is not None:
            raise _fail("started_not_next", "the output ended before turn.started")
        if state.pending:
            raise _fail("unanswered_request", f"no response for {sorted(state.pending)[:5]}")
        if state.turns:
            raise _fail("missing_terminal", f"turns without a terminal: {sorted(state.turns)}")
        if state.logins:
            raise _fail("missing_terminal", f"logins without a terminal: {sorted(state.logins)}")

    def snapshot(self) -> Snapshot:
        state = self._state
        return Snapshot(
            pending=tuple(sorted(state.pending.items())),
            turns=tuple(sorted(state.turns.items())),
            logins=tuple(sorted(state.logins.items())),
            expect_started=state.expect_started,
            finished=tuple(sorted(state.finished.items())),
            received=state.received,
        )

    @property
    def open_turns(self) -> dict[str, TurnStream]:
        """Active turns by the request ID that started them."""
        return dict(self._state.turns)

    # -- checks (nothing below changes state until the returned function runs) ------------

    def _decode(self, line: bytes) -> dict[str, Any]:
        if len(line) > MAX_RECORD_BYTES:
            raise _fail("record_too_large", f"{len(line)} bytes with the newline")
        if not line.endswith(b"\n"):
            raise _fail("unterminated_record", "a record must end with a newline")
        try:
            record = orjson.loads(line[:-1])
        except orjson.JSONDecodeError as exc:
            raise _fail("invalid_json", "not UTF-8 JSON") from exc
        if not isinstance(record, dict):
            raise _fail("not_an_object", "a record must be a JSON object")
        try:
            check_bounds(record)
        except ServiceError as exc:
            raise _fail("limit_exceeded", "a structural bound is exceeded") from exc
        version = record.get("protocol_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise _fail("invalid_envelope", "protocol_version is not an integer")
        if version != PROTOCOL_VERSION:
            raise _fail("unsupported_version", f"protocol_version {version}")
        payload = record.get("payload")
        if payload is not None and len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
            raise _fail("payload_too_large", "the payload is over 32,768 bytes")
        return record

    def _members(self, record: dict[str, Any], names: tuple[str, ...]) -> None:
        missing = [name for name in names if name not in record]
        if missing:
            raise _fail("invalid_envelope", f"missing {missing}")

    def _response(self, record: dict[str, Any]) -> Callable[[], None]:
        self._members(record, _RESPONSE_MEMBERS)
        request_id = _optional_id(record["request_id"], "request_id")
        session_id = _optional_id(record["session_id"], "session_id")
        method = record["method"]
        if method is not None:
            _string(method, "method", limit=MAX_NAME_BYTES, empty=False, reason="invalid_envelope")
        payload, error = record["payload"], record["error"]
        if (payload is None) == (error is None):
            raise _fail("invalid_envelope", "exactly one of payload and error must be set")
        if payload is not None and not isinstance(payload, dict):
            raise _fail("invalid_envelope", "payload is not an object")
        if error is not None:
            if not isinstance(error, dict):
                raise _fail("invalid_envelope", "error is not an object")
            code, message = error.get("code"), error.get("message")
            _string(
                code, "error.code", limit=MAX_NAME_BYTES, empty=False, reason="invalid_envelope"
            )
            _string(
                message, "error.message", limit=MAX_ERROR_MESSAGE_BYTES, reason="invalid_envelope"
            )
        state = self._state
        if state.expect_started is not None:
            raise _fail("started_not_next", "turn.started must follow its acceptance")
        if request_id is None:
            if error is None:
                raise _fail("invalid_envelope", "a success response must carry its request_id")
            return _nothing  # uncorrelated error: nothing to match
        candidates = state.pending.get(request_id)
        if not candidates:
            raise _fail("unknown_request_id", f"no request {request_id!r} in flight")
        index = next(
            (
                i
                for i, p in enumerate(candidates)
                if p.method == method and (p.session_id is None or p.session_id == session_id)
            ),
            None,
        )
        if index is None:
            raise _fail(
                "mismatched_response",
                f"{request_id!r}: method/session_id differ from the request's",
            )
        rest = candidates[:index] + candidates[index + 1 :]
        start: Callable[[], None] = _nothing
        if isinstance(payload, dict) and method == "turn.start":
            start = self._turn_accepted(request_id, session_id, payload)
        elif isinstance(payload, dict) and method == "auth.login.start":
            start = self._login_accepted(request_id, payload)

        def apply() -> None:
            if rest:
                state.pending[request_id] = rest
            else:
                del state.pending[request_id]
            start()

        return apply

    def _turn_accepted(
        self, request_id: str, session_id: str | None, payload: dict[str, Any]
    ) -> Callable[[], None]:
        turn_id = _string(payload.get("turn_id"), "turn_id", empty=False)
        turn_session = _string(payload.get("session_id"), "session_id", empty=False)
        if payload.get("status") != "accepted":
            raise _fail("invalid_payload", "turn.start status is not accepted")
        if session_id != turn_session:
            raise _fail("mismatched_response", "turn.start session_id differs from the payload's")
        state = self._state
        if request_id in state.turns:
            raise _fail("duplicate_stream", f"{request_id!r} already runs a turn")

        def apply() -> None:
            state.turns[request_id] = TurnStream(turn_id, turn_session)
            state.expect_started = request_id
            state.finished.pop(request_id, None)

        return apply

    def _login_accepted(self, request_id: str, payload: dict[str, Any]) -> Callable[[], None]:
        login_id = _string(payload.get("login_id"), "login_id", empty=False)
        state = self._state
        if request_id in state.logins:
            raise _fail("duplicate_stream", f"{request_id!r} already runs a login")

        def apply() -> None:
            state.logins[request_id] = LoginStream(login_id)
            state.finished.pop(request_id, None)

        return apply

    def _event(self, record: dict[str, Any]) -> Callable[[], None]:
        self._members(record, _EVENT_MEMBERS)
        _string(
            record["event_id"],
            "event_id",
            limit=MAX_ID_BYTES,
            empty=False,
            reason="invalid_envelope",
        )
        request_id = _optional_id(record["request_id"], "request_id")
        session_id = _optional_id(record["session_id"], "session_id")
        name = _string(
            record["event"], "event", limit=MAX_NAME_BYTES, empty=False, reason="invalid_envelope"
        )
        if not isinstance(record["payload"], dict):
            raise _fail("invalid_envelope", "payload is not an object")
        payload: dict[str, Any] = record["payload"]
        state = self._state
        if state.expect_started is not None and name != "turn.started":
            raise _fail("started_not_next", "turn.started must follow its acceptance")
        if name in TURN_EVENTS:
            return self._turn_event(name, request_id, session_id, payload)
        if name in LOGIN_EVENTS:
            return self._login_event(name, request_id, session_id, payload)
        return _nothing  # an event of a later version: ignored

    def _stream_gone(self, name: str, request_id: str | None) -> StreamViolation:
        ended = self._state.finished.get(request_id or "")
        if ended is not None:
            return _fail("event_after_terminal", f"{name} after the terminal of {ended!r}")
        return _fail("unknown_stream", f"{name} for request {request_id!r} has no stream")

    def _turn_event(
        self, name: str, request_id: str | None, session_id: str | None, payload: dict[str, Any]
    ) -> Callable[[], None]:
        state = self._state
        turn = state.turns.get(request_id or "")
        if request_id is None or turn is None:
            raise self._stream_gone(name, request_id)
        if session_id != turn.session_id:
            raise _fail("mismatched_event", f"{name} session_id is not the turn's")
        if payload.get("turn_id") != turn.turn_id:
            raise _fail("mismatched_event", f"{name} turn_id is not the turn's")
        sequence = _integer(payload.get("sequence"), f"{name} sequence")
        if name == "turn.started":
            if state.expect_started != request_id or turn.started:
                raise _fail("duplicate_started", "turn.started twice, or not after acceptance")
            if sequence != 0 or payload.get("status") != "started":
                raise _fail("sequence_violation", "turn.started must have sequence 0")
            if payload.get("session_id") != turn.session_id:
                raise _fail("mismatched_event", "turn.started session_id is not the turn's")
            started = replace(turn, started=True)

            def apply_started() -> None:
                state.turns[request_id] = started
                state.expect_started = None

            return apply_started
        if sequence == turn.last_sequence:
            raise _fail("sequence_repeat", f"{name} repeats sequence {sequence}")
        if sequence < turn.last_sequence:
            raise _fail(
                "sequence_out_of_order", f"{name} sequence {sequence} after {turn.last_sequence}"
            )
        skipped = turn.skipped + sequence - turn.last_sequence - 1
        if name == "turn.terminal":
            return self._terminal(request_id, turn, payload, sequence, skipped)
        text = turn.text
        if name == "turn.assistant_delta":
            text = (*text, _string(payload.get("text"), "delta text"))
        else:
            activity = _object(payload.get("activity"), "activity")
            _string(activity.get("kind"), "activity kind", empty=False)
        moved = replace(turn, last_sequence=sequence, skipped=skipped, text=text)

        def apply() -> None:
            state.turns[request_id] = moved

        return apply

    def _terminal(
        self,
        request_id: str,
        turn: TurnStream,
        payload: dict[str, Any],
        sequence: int,
        skipped: int,
    ) -> Callable[[], None]:
        status = payload.get("status")
        if status not in TERMINAL_STATUSES:
            raise _fail("unknown_terminal_status", f"turn.terminal status {status!r}")
        dropped = _integer(payload.get("activity_dropped"), "activity_dropped")
        if dropped != skipped:
            raise _fail(
                "sequence_gap",
                f"{skipped} sequence numbers skipped, activity_dropped says {dropped}",
            )
        text = _string(payload.get("assistant_text"), "assistant_text")
        if text != "".join(turn.text):
            raise _fail("text_mismatch", "assistant_text is not the deltas joined")
        if payload.get("session_id") != turn.session_id:
            raise _fail("mismatched_event", "turn.terminal session_id is not the turn's")
        state = self._state

        def apply() -> None:
            del state.turns[request_id]
            self._remember(request_id, turn.turn_id)

        return apply

    def _login_event(
        self, name: str, request_id: str | None, session_id: str | None, payload: dict[str, Any]
    ) -> Callable[[], None]:
        state = self._state
        login = state.logins.get(request_id or "")
        if request_id is None or login is None:
            raise self._stream_gone(name, request_id)
        if session_id is not None:
            raise _fail("mismatched_event", f"{name} carries a session_id")
        if payload.get("login_id") != login.login_id:
            raise _fail("mismatched_event", f"{name} login_id is not the login's")
        state_name = _string(payload.get("state"), f"{name} state", empty=False)
        if name == "auth.login.progress":
            if state_name == "authorization_url":
                _string(payload.get("url"), "authorization url", empty=False)
            return _nothing

        def apply() -> None:
            del state.logins[request_id]
            self._remember(request_id, login.login_id)

        return apply

    def _remember(self, request_id: str, stream_id: str) -> None:
        finished = self._state.finished
        finished.pop(request_id, None)
        finished[request_id] = stream_id
        while len(finished) > _REMEMBERED:
            del finished[next(iter(finished))]
