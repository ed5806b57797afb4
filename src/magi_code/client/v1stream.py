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
  keys of 16,384 bytes); ``protocol_version`` other than 1, a ``kind`` other than
  ``response``/``event``;
- a record the consumer profile of the v1 definitions refuses
  (:func:`magi_code.protocol.schema.consumer.check_record`, the same rules as the
  consumer JSON Schema): a payload over 32,768 bytes, a known member missing, mistyped
  or out of its bounds, an
  unknown event, an unknown value of an enumeration without a fallback (activity kinds,
  statuses, sources, login states, ...), an unknown member beyond the structural
  bounds;
- a response whose ``request_id`` the client has no request in flight for, or whose
  ``method``/``session_id`` differ from that request's; an ``initialize`` answer whose two
  limit maps differ;
- per turn: ``turn.started`` not directly after its acceptance, sequences that repeat or
  go backwards, a terminal whose skipped sequence numbers differ from its
  ``activity_dropped`` or whose text differs from the deltas, and any event of the turn
  after its terminal (a second terminal included); the same for a login's events.

It tolerates what later v1 services may add within v1: unknown members of known objects
(bounded), new limits (positive integers), operations it does not use, error codes it
does not know (a failure of that request), and the tool transport ``unknown``.
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
    MAX_ID_BYTES,
    MAX_NAME_BYTES,
    MAX_RECORD_BYTES,
    PROTOCOL_VERSION,
)
from magi_code.protocol.schema import consumer
from magi_code.protocol.schema.definitions import EVENT_NAMES, EVENTS

# Which rule of the consumer profile a record broke -> the violation reported.
_LIMIT_RULES: Final = frozenset({"max_bytes", "max_items", "max_properties", "bounds"})
_VALUE_RULES: Final = frozenset({"enum", "tag"})
_TURN_EVENTS: Final = frozenset(ev.name for ev in EVENTS if ev.stream == "turn")
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


def _violation(mismatch: consumer.Mismatch) -> StreamViolation:
    """The violation a record the consumer profile refuses is reported as."""
    shape = mismatch.shape
    if mismatch.rule in _LIMIT_RULES:
        reason = "limit_exceeded"
    elif mismatch.rule == "max_json_bytes":
        reason = "payload_too_large"
    elif mismatch.rule == "enum" and getattr(shape, "enum", None) == EVENT_NAMES:
        reason = "unknown_event"  # a record of one, or one advertised
    elif mismatch.rule in _VALUE_RULES:
        reason = "unknown_value"
    elif mismatch.path[:1] == ("payload",):
        reason = "invalid_payload"
    else:
        reason = "invalid_envelope"
    return _fail(reason, str(mismatch))


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
        if kind not in ("response", "event"):
            raise _fail("unknown_kind", f"kind {kind!r} is not response or event")
        try:
            consumer.check_record(record)
        except consumer.Mismatch as exc:
            raise _violation(exc) from None
        apply = self._response(record) if kind == "response" else self._event(record)
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
        return record

    def _response(self, record: dict[str, Any]) -> Callable[[], None]:
        request_id: str | None = record["request_id"]
        session_id: str | None = record["session_id"]
        method: str | None = record["method"]
        payload: dict[str, Any] | None = record["payload"]
        state = self._state
        if state.expect_started is not None:
            raise _fail("started_not_next", "turn.started must follow its acceptance")
        if request_id is None:
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
        if (
            payload is not None
            and method == "initialize"
            and payload["limits"] != payload["capabilities"]["limits"]
        ):
            raise _fail("inconsistent_limits", "initialize advertises two different limit maps")
        start: Callable[[], None] = _nothing
        if payload is not None and method == "turn.start":
            start = self._turn_accepted(request_id, session_id, payload)
        elif payload is not None and method == "auth.login.start":
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
        turn_id: str = payload["turn_id"]
        turn_session: str = payload["session_id"]
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
        login_id: str = payload["login_id"]
        state = self._state
        if request_id in state.logins:
            raise _fail("duplicate_stream", f"{request_id!r} already runs a login")

        def apply() -> None:
            state.logins[request_id] = LoginStream(login_id)
            state.finished.pop(request_id, None)

        return apply

    def _event(self, record: dict[str, Any]) -> Callable[[], None]:
        request_id: str = record["request_id"]
        session_id: str | None = record["session_id"]
        name: str = record["event"]
        payload: dict[str, Any] = record["payload"]
        if self._state.expect_started is not None and name != "turn.started":
            raise _fail("started_not_next", "turn.started must follow its acceptance")
        if name in _TURN_EVENTS:
            assert session_id is not None  # the consumer profile requires it
            return self._turn_event(name, request_id, session_id, payload)
        return self._login_event(name, request_id, payload)

    def _stream_gone(self, name: str, request_id: str) -> StreamViolation:
        ended = self._state.finished.get(request_id)
        if ended is not None:
            return _fail("event_after_terminal", f"{name} after the terminal of {ended!r}")
        return _fail("unknown_stream", f"{name} for request {request_id!r} has no stream")

    def _turn_event(
        self, name: str, request_id: str, session_id: str, payload: dict[str, Any]
    ) -> Callable[[], None]:
        state = self._state
        turn = state.turns.get(request_id)
        if turn is None:
            raise self._stream_gone(name, request_id)
        if session_id != turn.session_id:
            raise _fail("mismatched_event", f"{name} session_id is not the turn's")
        if payload.get("turn_id") != turn.turn_id:
            raise _fail("mismatched_event", f"{name} turn_id is not the turn's")
        sequence: int = payload["sequence"]
        if name == "turn.started":
            if state.expect_started != request_id or turn.started:
                raise _fail("duplicate_started", "turn.started twice, or not after acceptance")
            if payload["session_id"] != turn.session_id:
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
            text = (*text, payload["text"])
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
        dropped: int = payload["activity_dropped"]
        if dropped != skipped:
            raise _fail(
                "sequence_gap",
                f"{skipped} sequence numbers skipped, activity_dropped says {dropped}",
            )
        if payload["assistant_text"] != "".join(turn.text):
            raise _fail("text_mismatch", "assistant_text is not the deltas joined")
        if payload["session_id"] != turn.session_id:
            raise _fail("mismatched_event", "turn.terminal session_id is not the turn's")
        state = self._state

        def apply() -> None:
            del state.turns[request_id]
            self._remember(request_id, turn.turn_id)

        return apply

    def _login_event(
        self, name: str, request_id: str, payload: dict[str, Any]
    ) -> Callable[[], None]:
        state = self._state
        login = state.logins.get(request_id)
        if login is None:
            raise self._stream_gone(name, request_id)
        if payload["login_id"] != login.login_id:
            raise _fail("mismatched_event", f"{name} login_id is not the login's")
        if name == "auth.login.progress":
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
