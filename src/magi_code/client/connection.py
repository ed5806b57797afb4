"""Typed async client for the magi-code daemon (protocol v2, RFC-0002).

:class:`Client` adds request/response correlation, a bounded event stream and the v2
operations (snapshot, attach, control grants) to a
:class:`~magi_code.client.channel.Channel`. One reader task reads the socket and routes
each frame: responses and answers to the call that waits for them, events into a bounded
buffer that :meth:`Client.events` drains. When that buffer is full the reader stops
reading the socket until there is room, so a slow consumer makes the daemon's own
overload mechanism fire (RFC-0002 §6.2) instead of this process's memory grow.

The client keeps the protocol's promises: a frame type it does not know, or a frame that
does not fit its type, is a protocol error that ends the connection; a fatal ``error``
frame's code reaches every waiting call and the event stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast

from magi_code.dataclass import dataclass, field
from magi_code.protocol import envelope, v2
from magi_code.protocol.frames import FrameError
from magi_code.protocol.v2 import MAX_FILTER_TURN_IDS, MESSAGES, Code, Role
from magi_code.storage.launch import LaunchContext
from magi_code.version import build_id

from .buffer import EventBuffer
from .channel import Channel, socket_for
from .errors import (
    ApprovalError,
    ControlError,
    ControlRefused,
    DaemonError,
    DaemonUnavailable,
    DeadlineExceeded,
    GrantsError,
    OutcomeUnknown,
    QueueError,
    SessionError,
    SteerError,
    WatchError,
)
from .starter import ensure_daemon
from .types import (
    ApprovalRequest,
    ApprovalResolved,
    AttachResult,
    AttachStatus,
    ControlChanged,
    ControlGranted,
    ControlRequested,
    ControlStatus,
    Event,
    EventEnvelope,
    FileRequest,
    Grants,
    Overloaded,
    QueueChanged,
    QueueEntry,
    ResponseEnvelope,
    RewindResult,
    Rewound,
    SessionInfo,
    SessionsPage,
    SnapshotItem,
    SnapshotPage,
    TitleChanged,
    ToolDetail,
    TranscriptPage,
    TurnStarted,
    Watched,
    WatchedApproval,
    WatchOverloaded,
    WatchResult,
)

MAX_QUEUED_EVENTS: Final = 1024
"""The default bound of a client's event buffer (events and overload notices)."""

# The frame types answering each call, by the type the call sent.
_ANSWERS: Final[dict[str, tuple[str, str]]] = {
    "control": ("control_result", "control_error"),
    "snapshot": ("snapshot_result", "snapshot_error"),
    "attach": ("attach_result", "attach_error"),
    "take_control": ("control_granted", "grant_error"),
    "approval_answer": ("approval_already_resolved", "approval_error"),
    "grants_list": ("grants_result", "grants_error"),
    "grants_revoke": ("grants_result", "grants_error"),
    "approval_policy": ("approval_policy_result", "approval_error"),
    "steer": ("steer_result", "steer_error"),
    "sessions_list": ("sessions_result", "session_error"),
    "session_rename": ("session_result", "session_error"),
    "session_archive": ("session_result", "session_error"),
    "session_unarchive": ("session_result", "session_error"),
    "session_transcript": ("transcript_result", "session_error"),
    "session_selection": ("session_selection_result", "session_selection_error"),
    "session_fork": ("session_result", "session_error"),
    "session_rewind": ("rewind_result", "session_error"),
    "watch": ("watch_result", "watch_error"),
    "unwatch": ("unwatched", "watch_error"),
    "control_request": ("control_granted", "grant_error"),
    "control_release": ("control_released", "grant_error"),
    "control_answer": ("control_answered", "grant_error"),
    "queue_add": ("queue_result", "queue_error"),
    "queue_list": ("queue_result", "queue_error"),
    "queue_remove": ("queue_result", "queue_error"),
    "queue_move": ("queue_result", "queue_error"),
    "queue_send_now": ("queue_result", "queue_error"),
}
# Calls answered in parts: the first frame's type, then the continuations'.
_PARTS: Final = {"attach": "attach_more", "watch": "watch_more"}
# The exception a call's failure frame raises (DaemonError for the others).
_FAILURES: Final[dict[str, type[DaemonError]]] = {
    "approval_error": ApprovalError,
    "grants_error": GrantsError,
    "steer_error": SteerError,
    "session_error": SessionError,
    "grant_error": ControlError,
    "watch_error": WatchError,
    "queue_error": QueueError,
}
_Answer = TypeVar("_Answer", bound=v2.AnswerBody)
# A frame builder of ``protocol/v2.py`` with every member but the frame ID given.
_Build = partial[dict[str, Any]]


def new_idempotency_key() -> str:
    """A fresh key for ``turn.start`` (24 URL-safe characters, within the v2 rule)."""
    return secrets.token_urlsafe(18)


class _Broken(Exception):
    """The daemon's frames end the connection; ``error`` is what callers are told."""

    def __init__(self, error: DaemonError) -> None:
        super().__init__(str(error))
        self.error = error


def _protocol_error(what: str) -> _Broken:
    return _Broken(DaemonError(f"the daemon broke the protocol: {what}", Code.PROTOCOL_ERROR.value))


@dataclass(eq=False, slots=True)
class _Request:
    future: asyncio.Future[ResponseEnvelope]
    method: str
    payload: Mapping[str, Any] | None
    session_id: str | None
    idempotency_key: str | None


@dataclass(eq=False, slots=True)
class _Call:
    sent: str
    future: asyncio.Future[v2.AnswerBody]
    first: v2.AttachPart | v2.WatchPart | None = None  # a call answered in parts: its first
    approval_id: str | None = None  # approval_answer: settled by its approval_resolved too
    events: list[dict[str, Any]] = field(default_factory=list)


class Client:
    """A ``persistent`` (or ``control``) connection with request/response correlation.

    Consume :meth:`events` concurrently with your requests (in its own task). Events
    wait in a bounded buffer (``max_queued_events``); when it is full the client stops
    reading the socket, so answers to later requests wait too until events are taken,
    and the daemon cuts the connection from a turn's live stream with an
    :class:`Overloaded` notice rather than buffering without bound.

    Example::

        async with await Client.connect(LaunchContext.from_process()) as client:
            await client.request("initialize", {"supported_protocol_versions": [1]})
            reply = await client.request("turn.start", {"prompt": "hi"})
            async for event in client.events():
                if isinstance(event, Overloaded):
                    await client.attach(event.turn_id, event.after_sequence)
                elif event["event"] == "turn.terminal":
                    break
    """

    def __init__(self, channel: Channel, *, max_queued_events: int = MAX_QUEUED_EVENTS) -> None:
        if max_queued_events < 1:
            raise ValueError("max_queued_events must be at least 1")
        self.channel = channel
        self._ids = itertools.count(1)
        self._requests: dict[str, _Request] = {}
        self._calls: dict[int, _Call] = {}
        self._events = EventBuffer(max_queued_events)
        self._ended: DaemonError | DaemonUnavailable | None = None
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(
        cls,
        ctx: LaunchContext,
        role: Role = "persistent",
        *,
        autostart: bool = True,
        client_name: str = "magi_code.client",
        delta_interval_ms: int = 0,
        max_queued_events: int = MAX_QUEUED_EVENTS,
        options: Mapping[str, Any] | None = None,
        approvals: bool = False,
    ) -> Client:
        """Connect to the daemon of ``ctx.mc_home``, starting it on demand if allowed.

        ``delta_interval_ms`` (0..10000) asks the daemon to merge a turn's assistant
        deltas so they arrive at most once per interval (RFC-0002 §6.3).
        ``max_queued_events`` bounds the events waiting for :meth:`events`. ``options``
        are further ``hello`` options, e.g. ``{"tool_details": True}`` (RFC-0002 §3).
        ``approvals`` says this client answers approval requests (RFC-0002 §6.7):
        :class:`ApprovalRequest` and :class:`ApprovalResolved` then arrive among the
        events; answer with :meth:`answer_approval`.
        """
        options = {
            **(hello_options(delta_interval_ms=delta_interval_ms, approvals=approvals) or {}),
            **(options or {}),
        }
        channel = await connect_channel(
            ctx, role, autostart=autostart, client_name=client_name, options=options or None
        )
        return cls(channel, max_queued_events=max_queued_events)

    @property
    def welcome(self) -> dict[str, Any]:
        return self.channel.welcome

    @property
    def queued_events(self) -> int:
        """Events received and not yet taken by :meth:`events`."""
        return len(self._events)

    @property
    def backpressured(self) -> bool:
        """True while the event buffer is full and the socket is not being read."""
        return self._events.putting

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- v1 requests ----------------------------------------------------------------------

    async def request(
        self,
        method: str,
        payload: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
    ) -> ResponseEnvelope:
        """Send a v1 request envelope; returns its v1 response envelope.

        ``deadline_ms`` (Unix time in milliseconds): if the daemon reaches the request
        only after it (a ``turn.start``: or it passes during the turn's settings
        capture), the request does not run and :class:`DeadlineExceeded` is raised.

        ``turn.start`` carries an ``idempotency_key`` (a fresh one unless you pass your
        own: 1-64 ASCII letters, digits and ``-_.:``): the daemon answers a repeat of it
        with the original outcome and starts nothing. If the connection ends after the
        request was sent and before its response, :class:`OutcomeUnknown` is raised
        (with the key); resume with :meth:`resume_turn` on a new client.

        ``session.create`` and ``session.open`` may give the session ``mcp_servers`` of its
        own (RFC-0002 §6.13: ``{"name", "command", "args", "env"}`` maps), which replace
        the ones it had; a definition the daemon refuses raises :class:`DaemonError`
        ``invalid_mcp_servers``.
        """
        rid = request_id or f"c-{next(self._ids)}"
        if rid in self._requests:
            raise ValueError(f"request ID {rid!r} is already in flight on this client")
        if idempotency_key is None and method == "turn.start":
            idempotency_key = new_idempotency_key()
        frame = v2.request(
            envelope.request(rid, method, payload, session_id),
            deadline_ms,
            idempotency_key,
            mcp_servers,
        )
        self._check_open()  # nothing is sent on an ended connection: safe to retry
        future: asyncio.Future[ResponseEnvelope] = asyncio.get_running_loop().create_future()
        sent_payload = frame["message"]["payload"]  # a copy: later edits do not change it
        pending = _Request(future, method, sent_payload, session_id, idempotency_key)
        self._requests[rid] = pending
        try:
            await self.channel.send(frame)
        except FrameError as exc:  # raised while encoding, before any byte is written
            self._requests.pop(rid, None)
            raise ValueError(f"the request cannot be sent: {exc}") from None
        except (ConnectionError, OSError) as exc:
            self._requests.pop(rid, None)
            raise _outcome_unknown(rid, pending, None) from exc
        try:
            return await future
        finally:
            if self._requests.get(rid) is pending:
                del self._requests[rid]

    async def resume_turn(
        self, outcome: OutcomeUnknown
    ) -> tuple[ResponseEnvelope, AttachResult | None]:
        """Learn what became of a ``turn.start`` whose response was lost, and follow it.

        Re-sends the same ``turn.start`` (same idempotency key, payload and session) on
        this connection (a new one, initialized): the daemon answers with the original
        acceptance (or the original error) and starts nothing, or starts the turn now if
        the first request never reached it. On acceptance the turn is attached from its
        first event (``after_sequence`` -1, with the session so a turn the daemon no
        longer buffers is answered from durable history); the attach result is None
        when the response is an error.
        """
        if outcome.method != "turn.start" or outcome.idempotency_key is None:
            raise ValueError("only a turn.start with an idempotency key can be resumed")
        response = await self.request(
            "turn.start",
            outcome.payload,
            session_id=outcome.session_id,
            idempotency_key=outcome.idempotency_key,
        )
        accepted = response["payload"]
        if response["error"] is not None or accepted is None:
            return response, None
        turn_id, session_id = accepted.get("turn_id"), accepted.get("session_id")
        if not isinstance(turn_id, str) or not isinstance(session_id, str | None):
            raise DaemonError(
                "the daemon accepted a turn without a turn ID", Code.PROTOCOL_ERROR.value
            )
        attached = await self.attach(turn_id, -1, session_id=session_id)
        return response, attached

    # -- v2 operations --------------------------------------------------------------------

    async def control(self, op: str) -> dict[str, Any]:
        """``status``, ``stop`` or ``restart``; the result map (see also :meth:`status`)."""
        return (await self._call(partial(v2.control, op=op), v2.ControlResult)).result

    async def status(self) -> ControlStatus:
        """The daemon's ``status`` (RFC-0002 §4)."""
        return cast(ControlStatus, await self.control("status"))

    async def snapshot_pages(
        self,
        *,
        session_id: str | None = None,
        turn_ids: Iterable[str] | None = None,
        project_dir: str | Path | None = None,
    ) -> AsyncIterator[SnapshotPage]:
        """Pages of the turns the daemon knows (running, or finished within retention).

        Filters combine: one session, these turns, one project directory (absolute).
        Follows ``next_cursor`` until the last page; more than 256 ``turn_ids`` are
        asked for in groups. Bad arguments raise :class:`DaemonError` (``invalid_request``).
        """
        if isinstance(turn_ids, str):
            raise TypeError("turn_ids must be an iterable of turn IDs, not one string")
        directory = None if project_dir is None else str(project_dir)
        groups: list[list[str] | None] = [None]
        if turn_ids is not None:
            ids = list(dict.fromkeys(turn_ids))
            step = MAX_FILTER_TURN_IDS
            groups = [ids[i : i + step] for i in range(0, len(ids), step)] if ids else [[]]
        for group in groups:
            cursor: str | None = None
            while True:
                frame = partial(
                    v2.snapshot,
                    session_id=session_id,
                    project_dir=directory,
                    turn_ids=group,
                    cursor=cursor,
                )
                answer = await self._call(frame, v2.SnapshotResult)
                page = SnapshotPage(
                    turns=cast(list[SnapshotItem], answer.turns), next_cursor=answer.next_cursor
                )
                yield page
                cursor = page["next_cursor"]
                if cursor is None:
                    break

    async def snapshot(
        self,
        *,
        session_id: str | None = None,
        turn_ids: Iterable[str] | None = None,
        project_dir: str | Path | None = None,
    ) -> list[SnapshotItem]:
        """Every matching turn, all pages followed (see :meth:`snapshot_pages`)."""
        items: list[SnapshotItem] = []
        pages = self.snapshot_pages(
            session_id=session_id, turn_ids=turn_ids, project_dir=project_dir
        )
        async for page in pages:
            items.extend(page["turns"])
        return items

    async def attach(
        self, turn_id: str, after_sequence: int = -1, *, session_id: str | None = None
    ) -> AttachResult:
        """Follow a turn: its buffered events after ``after_sequence``, then live events.

        Returns once every part of the answer arrived (a long answer comes in several
        frames), with the events of all parts in order. Later events of the turn arrive
        through :meth:`events` (status ``attached`` or ``resync``). With ``session_id``,
        a turn the daemon no longer buffers is answered from the session's durable
        history (``finished``). Errors raise :class:`DaemonError` with ``code``
        (``unknown_turn``, ``invalid_request``, ``session_busy``).
        """
        frame = partial(
            v2.attach, turn_id=turn_id, after_sequence=after_sequence, session_id=session_id
        )
        answer = await self._call(frame, v2.AttachPart)
        return AttachResult(
            turn_id=turn_id,
            status=cast(AttachStatus, answer.status),
            events=cast(list[EventEnvelope], answer.events),
            failure=answer.failure,
        )

    async def take_control(self, session_id: str) -> ControlGranted:
        """Become the session's controller (RFC-0002 §6.1).

        Takes over a session held by a lost persistent client, with its running turn
        (which this connection may then cancel), or opens a free one. Returns the
        session and its running turns with their last sequence (follow them with
        :meth:`attach`); raises :class:`DaemonError` with ``code`` (e.g.
        ``session_busy``) otherwise.
        """
        frame = partial(v2.take_control, session_id=session_id)
        return _granted(await self._call(frame, v2.ControlGrantedResult), session_id)

    async def request_control(self, session_id: str) -> ControlGranted:
        """Ask for a session another connected client controls (RFC-0002 §6.1).

        Answered at once like :meth:`take_control` when the session is free, released,
        held by this client or by a lost one. Otherwise its controller gets
        :class:`ControlRequested` and this call waits for its answer: granted, or
        :class:`ControlRefused`; unanswered for the daemon's request timeout (30 s by
        default) it is granted as soon as no turn runs on the session. Other calls of
        this client go on meanwhile. Raises :class:`ControlError` (``session_busy``: a
        request already waits, or a v1 shim holds the session; ``limit_exceeded``; ...).
        """
        frame = partial(v2.control_request, session_id=session_id)
        answer = await self._call(frame, v2.ControlGrantedResult)
        return _granted(answer, session_id)

    async def release_control(self, session_id: str) -> None:
        """Give up this client's hold of the session (idempotent). With no turn running it
        is free at once; during a turn anyone may take it, and it is freed when the turn
        ends. A waiting :meth:`request_control` of another client is granted."""
        await self._call_id(partial(v2.control_release, session_id=session_id))

    async def answer_control(self, session_id: str, grant: bool) -> None:
        """Answer a :class:`ControlRequested` for a session this client controls: ``True``
        hands the session (with its running turn) to the requester, ``False`` refuses.
        Raises :class:`ControlError` (``invalid_request``) when no request waits."""
        await self._call_id(partial(v2.control_answer, session_id=session_id, grant=grant))

    # -- watching --------------------------------------------------------------------------

    async def watch(self, session_id: str, after_cursor: str | None = None) -> WatchResult:
        """Watch a session (RFC-0002 §6.9): its history after ``after_cursor`` (from the
        start without it), then, through :meth:`events`, every turn any client runs on it
        and its session events, as :class:`Watched` values.

        Each turn comes either in the history or live (from :class:`TurnStarted` and its
        ``turn.started``), never both and none missing. To resume later, watch again from
        the last history cursor received. Watching a watched session again replaces the
        watch. Raises :class:`WatchError` (``resync_required``, ``limit_exceeded``: more
        than 1,024 history items, page them with ``session.replay`` first; ...).
        """
        frame = partial(v2.watch, session_id=session_id, after_cursor=after_cursor)
        answer = await self._call(frame, v2.WatchPart)
        if answer.before_cursor is None or answer.gap is None:  # the first part has both
            raise self._fail_protocol("watch_result without before_cursor and gap")
        return WatchResult(
            session_id=answer.session_id or session_id,
            items=answer.events,
            before_cursor=answer.before_cursor,
            gap=answer.gap,
        )

    async def unwatch(self, session_id: str) -> None:
        """Stop watching the session (a session not watched is answered the same). Frames
        the daemon sent before the answer may still arrive."""
        await self._call_id(partial(v2.unwatch, session_id=session_id))

    async def answer_file(
        self, request: FileRequest, *, content: str | None = None, error: str | None = None
    ) -> None:
        """Answer a :class:`FileRequest`: the file's text for a ``read``, nothing for a
        ``write`` that was done, or ``error`` (a short text for the model) when it was not.
        An answer after the daemon stopped waiting is dropped."""
        self._check_open()
        try:
            await self.channel.send(v2.fs_result(request.fs_id, content, error))
        except FrameError as exc:
            raise ValueError(f"the frame cannot be sent: {exc}") from None
        except (ConnectionError, OSError):
            raise DaemonUnavailable("the connection to the daemon was lost") from None

    # -- approvals -------------------------------------------------------------------------

    async def answer_approval(self, approval_id: str, decision: str) -> ApprovalResolved:
        """Answer an :class:`ApprovalRequest` with one of its ``options``.

        Returns how the request was settled: by this answer, or (when another frontend or
        the deadline came first) by the earlier one: compare ``decision`` and ``by``.
        Raises :class:`ApprovalError` (``unknown_approval``: no such request this
        connection is attached to, or a decision not offered; ``invalid_request``).
        """
        frame = partial(v2.approval_answer, approval_id=approval_id, decision=decision)
        resolved = await self._call(frame, v2.ApprovalResolvedFrame, approval_id=approval_id)
        return _resolved(resolved)

    async def grants_list(self, session_id: str | None = None) -> Grants:
        """The session's grants (``allow_session`` answers; with ``session_id``) and the
        project settings' allow rules of this connection's project (RFC-0002 §6.7)."""
        frame = partial(v2.grants_list, session_id=session_id)
        return _grants(await self._call(frame, v2.GrantsResult))

    async def grants_revoke(
        self, scope: str, kind: str, value: Sequence[str] | str, *, session_id: str | None = None
    ) -> Grants:
        """Remove one grant; returns the grants after the change.

        ``scope`` is ``session`` (with ``session_id``) or ``project`` (the project settings'
        allow rule); ``kind`` is ``commands`` (``value`` an argv list), ``tools`` or
        ``paths`` (``value`` a string). Removing a grant that is not there changes nothing.
        Raises :class:`GrantsError` (``invalid_request``, ``grants_unavailable``).
        """
        frame = partial(
            v2.grants_revoke, scope=scope, kind=kind, value=value, session_id=session_id
        )
        return _grants(await self._call(frame, v2.GrantsResult))

    async def set_session_policy(self, session_id: str, policy: str | None) -> str | None:
        """Give the session its own approval policy (``auto``, ``ask``, ``read_only``;
        None: the settings' again), from its next tool call on, while the daemon runs.
        It is never looser than an untrusted project's file asks (RFC-0002 §6.7).

        Returns the policy the session's calls in this connection's project get now (None
        if the settings cannot be read). Raises :class:`ApprovalError` (``invalid_request``).
        """
        frame = partial(v2.approval_policy, session_id=session_id, policy=policy)
        return (await self._call(frame, v2.PolicyResult)).effective

    async def set_session_selection(
        self,
        session_id: str,
        provider_id: str | None,
        model_id: str | None,
        thinking_level: str | None = None,
    ) -> dict[str, Any]:
        """Give the session its own provider, model and reasoning level (all None: the
        settings' again) for its next turns, while the daemon runs (RFC-0002 §6.15).

        Returns what the session's turns in this connection's project get now:
        ``provider_id``, ``model_id``, ``thinking_level``, ``available_thinking_levels``.
        Raises :class:`DaemonError` (``invalid_request``, ``invalid_selection``,
        ``catalog_unavailable``, ``catalog_stale``, ``unsupported_reasoning``, ...).
        """
        frame = partial(
            v2.session_selection,
            session_id=session_id,
            provider_id=provider_id,
            model_id=model_id,
            thinking_level=thinking_level,
        )
        return (await self._call(frame, v2.SelectionResult)).effective

    # -- steering --------------------------------------------------------------------------

    async def steer(self, turn_id: str, text: str) -> None:
        """Send ``text`` into a running turn of a session this connection controls
        (RFC-0002 §6.10): returns once it entered the turn, at its next request boundary
        (after the tool calls in flight), as a user message and a ``turn.steered`` event.

        Raises :class:`SteerError`: ``turn_finished`` (the turn ended first: the text
        went to the head of the session's queue as ``error.entry_id``, or, when the queue
        could not take it, nothing was written and ``error.text`` holds it),
        ``unknown_turn``, ``invalid_request``.
        """
        try:
            await self._call_id(partial(v2.steer, turn_id=turn_id, text=text))
        except SteerError as exc:
            exc.text = text
            raise

    # -- the prompt queue -------------------------------------------------------------------

    async def queue_list(self, session_id: str) -> list[QueueEntry]:
        """The session's queued prompts, in the order they run (RFC-0002 §6.12). Any
        connection may list them; listing also resumes a queue that waits to be served
        (after a daemon restart). Raises :class:`QueueError`."""
        return await self._queue(partial(v2.queue_list, session_id=session_id))

    async def queue_add(self, session_id: str, text: str) -> QueueEntry:
        """Queue ``text`` at the tail of a session this connection controls: it runs as
        a turn when the session is free, also after this client is gone. Returns the new
        entry. Raises :class:`QueueError` (``not_controller``, ``limit_exceeded``, ...)."""
        frame = partial(v2.queue_add, session_id=session_id, text=text)
        answer = await self._call(frame, v2.QueueResult)
        if answer.entry_id is None:
            raise self._fail_protocol("queue_result without the added entry's ID")
        entry = next((e for e in answer.entries if e["entry_id"] == answer.entry_id), None)
        if entry is None:
            # Its turn may have started already, taking it off the queue.
            return QueueEntry(entry_id=answer.entry_id, text=text, by="", added_at="")
        return cast(QueueEntry, entry)

    async def queue_remove(self, session_id: str, entry_id: str) -> list[QueueEntry]:
        """Drop an entry; returns the queue after. Raises :class:`QueueError`."""
        return await self._queue(partial(v2.queue_remove, session_id=session_id, entry_id=entry_id))

    async def queue_move(self, session_id: str, entry_id: str, index: int) -> list[QueueEntry]:
        """Move an entry to ``index`` (0: the head; past the tail: the tail); returns the
        queue after. Raises :class:`QueueError`."""
        frame = partial(v2.queue_move, session_id=session_id, entry_id=entry_id, index=index)
        return await self._queue(frame)

    async def queue_send_now(self, session_id: str, entry_id: str) -> list[QueueEntry]:
        """Steer the entry into the session's running turn (as :meth:`steer`; it leaves
        the queue once it entered), or, with no turn running, run it next. Returns the
        queue after. Raises :class:`QueueError` ``turn_finished`` when the turn ended
        before the text entered (the entry is then at the head of the queue)."""
        return await self._queue(
            partial(v2.queue_send_now, session_id=session_id, entry_id=entry_id)
        )

    async def _queue(self, frame: _Build) -> list[QueueEntry]:
        return cast(list[QueueEntry], (await self._call(frame, v2.QueueResult)).entries)

    # -- the session library ---------------------------------------------------------------

    async def list_sessions(
        self,
        *,
        project_dir: str | None = None,
        title: str | None = None,
        archived: bool | Literal["all"] = False,
        cursor: str | None = None,
        limit: int = 32,
    ) -> SessionsPage:
        """One page of the session library, most recent activity first (RFC-0002 §6.11).

        Filters: ``project_dir`` (the directory a session was created in; sessions older
        than that record match none), ``title`` (a case-insensitive substring),
        ``archived`` (False: not archived; True: archived only; ``"all"``). Pass the
        page's ``next_cursor`` as ``cursor`` for the next one. Raises
        :class:`SessionError` (``invalid_request``, ``session_unavailable``).
        """
        frame = partial(
            v2.sessions_list,
            archived=archived,
            limit=limit,
            project_dir=project_dir,
            title=title,
            cursor=cursor,
        )
        answer = await self._call(frame, v2.SessionsResult)
        return SessionsPage(
            sessions=cast(list[SessionInfo], answer.sessions),
            next_cursor=answer.next_cursor,
            incomplete=answer.incomplete,
        )

    async def rename_session(self, session_id: str, title: str) -> SessionInfo:
        """Give the session an explicit title (it wins over the first prompt's; stored
        sanitized, at most 80 characters). Raises :class:`SessionError`."""
        return await self._session_change(
            partial(v2.session_rename, session_id=session_id, title=title)
        )

    async def archive_session(self, session_id: str) -> SessionInfo:
        """Hide the session from the default lists (never deleted). Raises
        :class:`SessionError`."""
        return await self._session_change(partial(v2.session_archive, session_id=session_id))

    async def unarchive_session(self, session_id: str) -> SessionInfo:
        """Show an archived session in the default lists again. Raises
        :class:`SessionError`."""
        return await self._session_change(partial(v2.session_unarchive, session_id=session_id))

    async def transcript(self, session_id: str, cursor: str | None = None) -> TranscriptPage:
        """One page of the session's conversation with its tool calls, in order
        (RFC-0002 §6.14): the ``session.replay`` items (messages, summary, terminals) and
        ``tool_call`` items. Pass ``next_cursor`` for the next page. Raises
        :class:`SessionError` (``invalid_request``, ``invalid_session_id``,
        ``session_unavailable``, ``session_busy``)."""
        frame = partial(v2.session_transcript, session_id=session_id, cursor=cursor)
        answer = await self._call(frame, v2.TranscriptResult)
        return TranscriptPage(items=answer.items, next_cursor=answer.next_cursor, gap=answer.gap)

    async def fork_session(self, session_id: str, at_cursor: str) -> SessionInfo:
        """A new session whose history is this one's up to ``at_cursor`` (a
        ``session.replay`` cursor at a turn boundary: the start, or a ``terminal`` item's);
        returns the fork's entry. A read: no control needed (RFC-0002 §6.16). Raises
        :class:`SessionError` (``resync_required``, ``not_turn_boundary``, ...)."""
        return await self._session_change(
            partial(v2.session_fork, session_id=session_id, at_cursor=at_cursor)
        )

    async def rewind_session(
        self,
        session_id: str,
        at_cursor: str,
        *,
        files: bool = True,
        commit: bool = False,
        force: bool = False,
    ) -> RewindResult:
        """Go back to ``at_cursor`` (as for ``fork_session``): without ``commit``, the
        preview (which messages go; with ``files``, which files change back and which
        changed outside the agent since: ``conflict``); with ``commit``, the rewind
        (needs control of the session; files in conflict are left alone unless
        ``force``). Raises :class:`SessionError` (also ``turn_running``, ``session_busy``)."""
        frame = partial(
            v2.session_rewind,
            session_id=session_id,
            at_cursor=at_cursor,
            files=files,
            commit=commit,
            force=force,
        )
        answer = await self._call(frame, v2.RewindAnswer)
        return cast(RewindResult, answer.result)

    async def _session_change(self, frame: _Build) -> SessionInfo:
        return cast(SessionInfo, (await self._call(frame, v2.SessionResult)).session)

    # -- events -----------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Event]:
        """v1 event envelopes and :class:`Overloaded` notices, in arrival order.

        Ends when the connection closes cleanly; raises :class:`DaemonError` (with the
        fatal or protocol-error ``code``) after the events that came before it when the
        connection ended with an error. Run it concurrently with your requests: while
        nobody takes events and the buffer is full, nothing else is read either.

        On :class:`Overloaded` no more live events of that turn arrive until you call
        ``attach(notice.turn_id, notice.after_sequence)``.
        """
        while (event := await self.next_event()) is not None:
            yield event

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event; None once the connection closed cleanly.

        Raises :class:`TimeoutError` when none arrives within ``timeout`` seconds (no
        event is lost by that), and the connection's error like :meth:`events`.
        """
        return await self._events.get(timeout)

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.channel.close()

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._ended is not None:
            if isinstance(self._ended, DaemonError):
                raise DaemonError(str(self._ended), self._ended.code)
            raise DaemonUnavailable(str(self._ended))

    def _fail_protocol(self, what: str) -> DaemonError:
        """A malformed answer found by a caller: end the connection like the reader does."""
        error = _protocol_error(what).error
        self.channel.abort()
        self._reader.cancel()
        self._finish(error)
        return error

    async def _call(
        self, build: _Build, answer: type[_Answer], *, approval_id: str | None = None
    ) -> _Answer:
        """``_call_id``'s answer, of the type the answering frame's type decodes to."""
        result = await self._call_id(build, approval_id=approval_id)
        if not isinstance(result, answer):  # the frame type was checked (``_answer``)
            raise self._fail_protocol(f"an unexpected answer to {build.func.__name__}")
        return result

    async def _call_id(self, build: _Build, *, approval_id: str | None = None) -> v2.AnswerBody:
        """Send the frame ``build`` makes with the next frame ID; wait for its answer."""
        self._check_open()
        frame_id = next(self._ids)
        frame = build(frame_id)
        future: asyncio.Future[v2.AnswerBody] = asyncio.get_running_loop().create_future()
        self._calls[frame_id] = _Call(v2.call_type(frame), future, approval_id=approval_id)
        try:
            await self.channel.send(frame)
        except FrameError as exc:
            self._calls.pop(frame_id, None)
            raise ValueError(f"the frame cannot be sent: {exc}") from None
        except (ConnectionError, OSError):
            self._calls.pop(frame_id, None)
            raise DaemonUnavailable("the connection to the daemon was lost") from None
        # The call stays registered until its answer, even if this caller is cancelled,
        # so a late answer (or the rest of a split one) is recognized and dropped.
        return await future

    async def _read(self) -> None:
        error: DaemonError | None = None
        try:
            while True:
                try:
                    frame = await self.channel.recv()
                except DaemonError as exc:  # framing
                    error = exc
                    break
                except (ConnectionError, OSError):
                    frame = None
                if frame is None:
                    break
                await self._dispatch(frame)
        except _Broken as exc:
            error = exc.error
        finally:
            if error is not None:
                self.channel.abort()
            self._finish(error)

    def _finish(self, error: DaemonError | None) -> None:
        """The connection ended: fail what waits, end the event stream."""
        if self._ended is not None:
            return
        self._ended = error or DaemonUnavailable("the connection to the daemon was closed")
        requests, self._requests = self._requests, {}
        calls, self._calls = self._calls, {}
        for rid, pending in requests.items():
            if not pending.future.done():
                unknown = _outcome_unknown(rid, pending, error)
                unknown.__cause__ = error
                pending.future.set_exception(unknown)
        for call in calls.values():
            if not call.future.done():
                lost = error or DaemonUnavailable("the connection to the daemon ended")
                call.future.set_exception(
                    DaemonError(str(lost), lost.code) if isinstance(lost, DaemonError) else lost
                )
        self._events.close(error)

    async def _dispatch(self, frame: dict[str, Any]) -> None:
        try:
            decoded = v2.decode_persistent_frame(frame)
        except v2.Malformed as exc:
            raise _protocol_error(str(exc)) from None
        match decoded:
            case None:
                raise _Broken(
                    DaemonError("the daemon sent an unknown frame type", Code.UNKNOWN_FRAME.value)
                )
            case v2.MessageFrame() if decoded.response:
                self._response(decoded)
            case v2.MessageFrame():
                await self._events.put(cast(EventEnvelope, decoded.envelope))
            case v2.OverloadedFrame():
                await self._events.put(Overloaded(decoded.turn_id, decoded.after_sequence))
            case v2.ToolDetailFrame():
                detail = ToolDetail(
                    decoded.turn_id, decoded.session_id, decoded.activity_id, decoded.detail
                )
                await self._events.put(detail)
            case v2.FsRequestFrame():
                request = FileRequest(
                    decoded.fs_id,
                    decoded.turn_id,
                    decoded.session_id,
                    decoded.op,
                    decoded.path,
                    decoded.content,
                )
                await self._events.put(request)
            case v2.FatalFrame():
                message = decoded.message or _message_for(decoded.code)
                raise _Broken(DaemonError(message, decoded.code))
            case v2.RequestErrorFrame():
                self._request_error(decoded)
            case v2.WatchFrame():
                if (watched := _watched(decoded)) is not None:
                    await self._events.put(watched)
            case v2.ControlRequestedFrame():
                await self._events.put(_control_requested(decoded))
            case v2.ControlChangedFrame():
                await self._events.put(_control_changed(decoded))
            case v2.ApprovalRequestFrame():
                await self._events.put(_approval_request(decoded))
            case v2.ApprovalResolvedFrame():
                # A winning answer is answered only by this broadcast (no frame ID).
                for frame_id, call in list(self._calls.items()):
                    if call.approval_id == decoded.approval_id:
                        del self._calls[frame_id]
                        _settle(call.future, result=decoded)
                await self._events.put(_resolved(decoded))
            case v2.AnswerFrame():
                self._answer(decoded)

    def _response(self, message: v2.MessageFrame) -> None:
        rid = message.request_id
        pending = self._requests.pop(rid, None) if rid is not None else None
        if pending is not None and not pending.future.done():
            pending.future.set_result(cast(ResponseEnvelope, message.envelope))
        # A response nobody waits for (its caller was cancelled) is dropped.

    def _request_error(self, frame: v2.RequestErrorFrame) -> None:
        rid = frame.request_id
        pending = self._requests.pop(rid, None) if rid is not None else None
        if pending is None or pending.future.done():
            return
        code = frame.code
        message = frame.message or f"request rejected ({code})"
        error = DeadlineExceeded if code == Code.DEADLINE_EXCEEDED else DaemonError
        pending.future.set_exception(error(message, code))

    def _answer(self, answer: v2.AnswerFrame) -> None:
        if answer.id is None:
            return
        call = self._calls.get(answer.id)
        if call is None:
            return  # the answer to a call nobody waits for any more
        kind, body = answer.kind, answer.body
        result, failure = _ANSWERS[call.sent]
        continuation = kind == _PARTS.get(call.sent)
        if kind not in (result, failure) and not continuation:
            raise _protocol_error(f"{kind!r} answering a {call.sent!r} frame")
        if isinstance(body, v2.CallFailed):
            del self._calls[answer.id]
            error = _FAILURES.get(kind, DaemonError)
            if body.code == Code.CONTROL_REFUSED:
                error = ControlRefused
            exc = error(f"{call.sent} failed ({body.code})", body.code)
            if isinstance(exc, SteerError):
                exc.entry_id = body.entry_id  # a late steer's text went to the queue's head
            _settle(call.future, exception=exc)
            return
        if not isinstance(body, v2.AttachPart | v2.WatchPart):
            del self._calls[answer.id]
            _settle(call.future, result=body)
            return
        if kind == result:
            if call.first is not None:
                raise _protocol_error(f"an unexpected {kind}")
            call.first = body
        elif call.first is None:
            raise _protocol_error(f"{kind} before {result}")
        call.events.extend(body.events)
        if not body.more:
            del self._calls[answer.id]
            _settle(call.future, result=_joined(call.first, call.events))


def _joined(
    first: v2.AttachPart | v2.WatchPart, events: list[dict[str, Any]]
) -> v2.AttachPart | v2.WatchPart:
    """The first part of an answer with the events of every part."""
    if isinstance(first, v2.AttachPart):
        return v2.AttachPart(first.status, events, False, first.failure)
    return v2.WatchPart(first.session_id, events, False, first.before_cursor, first.gap)


def _granted(answer: v2.ControlGrantedResult, session_id: str) -> ControlGranted:
    granted = session_id if answer.session_id is None else answer.session_id
    return cast(ControlGranted, {"session_id": granted, "turns": answer.turns})


def _grants(answer: v2.GrantsResult) -> Grants:
    return cast(
        Grants,
        {
            "session": answer.session,
            "project": answer.project,
            "project_honoured": answer.project_honoured,
        },
    )


def _control_requested(frame: v2.ControlRequestedFrame) -> ControlRequested:
    return ControlRequested(frame.session_id, frame.by, frame.timeout_ms)


def _control_changed(frame: v2.ControlChangedFrame) -> ControlChanged:
    return ControlChanged(frame.session_id, frame.controller)


def _watched(frame: v2.WatchFrame) -> Watched | WatchOverloaded | None:
    """A watched session's frame as a value; None for a session event of a name this
    client does not know."""
    session_id, event = frame.session_id, frame.event
    match event:
        case None if frame.overloaded:
            return WatchOverloaded(session_id)
        case None:
            return None  # a session event this client does not know (a newer daemon's)
        case dict():
            return Watched(session_id, cast(EventEnvelope, event))
        case v2.TurnStartedFrame():
            started = TurnStarted(session_id, event.turn_id, event.by, event.prompt, event.complete)
            return Watched(session_id, started)
        case v2.ControlChangedFrame():
            return Watched(session_id, _control_changed(event))
        case v2.ControlRequestedFrame():
            return Watched(session_id, _control_requested(event))
        case v2.ApprovalRequestFrame():
            request = _approval_request(event)
            return Watched(
                session_id, WatchedApproval(session_id, request.turn_id, request=request)
            )
        case v2.ApprovalResolvedFrame():
            turn_id = cast(str, event.turn_id)  # a watched session's always names it
            return Watched(
                session_id, WatchedApproval(session_id, turn_id, resolved=_resolved(event))
            )
        case v2.QueueChangedFrame():
            entries = tuple(cast(list[QueueEntry], event.entries))
            return Watched(session_id, QueueChanged(session_id, entries))
        case v2.TitleChangedFrame():
            return Watched(session_id, TitleChanged(session_id, event.title))
        case v2.RewoundFrame():
            return Watched(session_id, Rewound(session_id, event.to_cursor))


def _settle(
    future: asyncio.Future[v2.AnswerBody],
    *,
    result: v2.AnswerBody | None = None,
    exception: BaseException | None = None,
) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    elif result is not None:
        future.set_result(result)


def _approval_request(frame: v2.ApprovalRequestFrame) -> ApprovalRequest:
    return ApprovalRequest(
        frame.approval_id,
        frame.turn_id,
        frame.session_id,
        frame.kind,
        frame.summary,
        frame.options,
        frame.deadline_ms,
        frame.activity_id,
    )


def _resolved(frame: v2.ApprovalResolvedFrame) -> ApprovalResolved:
    return ApprovalResolved(frame.approval_id, frame.decision, frame.by)


def hello_options(*, delta_interval_ms: int = 0, approvals: bool = False) -> dict[str, Any] | None:
    """The ``hello`` options of a persistent client (RFC-0002 §3, §6.3, §6.7)."""
    options: dict[str, Any] = {}
    if delta_interval_ms:
        options["delta_interval_ms"] = delta_interval_ms
    if approvals:
        options["approvals"] = True
    return options or None


def _outcome_unknown(rid: str, pending: _Request, error: DaemonError | None) -> OutcomeUnknown:
    why = "the connection ended" if error is None else f"the connection broke ({error.code})"
    return OutcomeUnknown(
        f"{why} after {pending.method} was sent and before its response; its outcome is unknown",
        method=pending.method,
        payload=pending.payload,
        session_id=pending.session_id,
        request_id=rid,
        idempotency_key=pending.idempotency_key,
        code=None if error is None else error.code,
    )


def _message_for(code: str) -> str:
    try:
        return MESSAGES[Code(code)]
    except ValueError:
        return f"the daemon ended the connection ({code})"


async def connect_channel(
    ctx: LaunchContext,
    role: Role,
    *,
    autostart: bool,
    client_name: str = "magi_code.client",
    options: Mapping[str, Any] | None = None,
) -> Channel:
    """Connect to the daemon for ``ctx``; with ``autostart`` start it when none answers."""
    launch = ctx  # a control hello sends only mc_home (RFC-0002 §3)

    async def attempt(build: str | None) -> Channel:
        return await Channel.open(
            socket_for(ctx),
            role,
            launch,
            client_name=client_name,
            options=options,
            build=build,
        )

    try:
        # Only a client that will use this daemon asks one of another build to make way.
        return await attempt(None if role == "control" else build_id())
    except DaemonUnavailable:
        if not autostart:
            raise
    for _ in range(3):  # a daemon may go idle between its start and our connect
        await ensure_daemon(ctx)
        with contextlib.suppress(DaemonUnavailable):
            # The daemon ensure_daemon found or started: never ask it to make way again.
            return await attempt(None)
    raise DaemonUnavailable("the daemon stopped while connecting")
