"""The persistent coordinator: what a long-lived service keeps across its connections.

Transport-neutral (the daemon's socket roles and the in-memory transport both drive it):

- **Registrations.** Every v1-shim or persistent connection is registered with the
  callback that ends its input. A v1 shim's work is cancelled and drained when it ends;
  a lost persistent client's turns run on (*detached*) and its sessions become takeable
  by another persistent client (control grants, RFC-0002 §6.1).
- **Idle accounting.** The service is busy while any connection is registered or any
  turn runs; :meth:`idle_for` says for how long it has not been.
- **Owner drop.** :meth:`drain` cancels every turn, ends every connection's input and
  waits until each connection's work is drained, so terminal records are persisted.
- **The journal.** Typed turn events of persistent connections feed :class:`TurnJournal`
  (snapshot, attach). A turn the journal no longer holds, or that an earlier daemon ran,
  is answered from durable session history when the caller names its session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from magi_code.config.effective import Effective, check_session_selection, resolve_effective
from magi_code.config.settings import Layer, load_settings
from magi_code.dataclass import dataclass, field
from magi_code.protocol import envelope, v2
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.v2 import MAX_TRANSCRIPT_PAGE_BYTES
from magi_code.sessions.ids import validate_session_id
from magi_code.sessions.listing import LibraryQuery
from magi_code.sessions.rewind import commit_rewind, plan_rewind, rewind_answer
from magi_code.sessions.store import Transcript
from magi_code.storage.launch import LaunchContext
from magi_code.tools.frontend import call_detail
from magi_code.turns import failures

from .approvals import ApprovalService
from .coordinator import Connection, ServiceCoordinator
from .handover import Handover
from .journal import SnapshotQuery, TurnJournal
from .output import TurnEvent
from .queue import Launch, PromptQueue
from .sessions import Attachment, SessionService
from .tool_relay import ToolRelay
from .turns import MAX_ACTIVE_TURNS, MAX_SERVICE_TURNS, TurnService
from .watch import (
    MAX_WATCH_HISTORY_ITEMS,
    SessionWatch,
    StaleCursor,
    WatchSink,
    history_before_live,
)

log = logging.getLogger(__name__)

# A terminal recovered from history for a turn whose service died carries this sequence:
# greater than any sequence the turn emitted, so a client's "after" comparisons hold.
RECOVERED_SEQUENCE: Final = 2**53 - 1


@dataclass(eq=False, slots=True)
class Registration:
    conn: Connection
    role: str
    end: Callable[[], None]
    # Sends a frame to a persistent client (``control_requested``); None for a v1 shim.
    notify: Callable[[dict[str, Any]], None] | None = None
    lost: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class PersistentCoordinator:
    def __init__(
        self, coordinator: ServiceCoordinator, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.coordinator = coordinator
        self.journal = TurnJournal(clock)
        self.draining = False
        self._clock = clock
        self._clients: dict[int, Registration] = {}
        self._last_busy = clock()
        turns = [s for s in coordinator.services if isinstance(s, TurnService)]
        sessions = [s for s in coordinator.services if isinstance(s, SessionService)]
        self.turns: TurnService | None = turns[0] if turns else None
        self.sessions: SessionService | None = sessions[0] if sessions else None
        # Approval requests and grants: the turn service's, else a service without turns.
        self.approvals = self.turns.approvals if self.turns is not None else ApprovalService()
        self.relay = self.turns.relay if self.turns is not None else ToolRelay()
        self.watchers = SessionWatch()
        self.approvals.observe = self.watchers.session
        self.handover = (
            Handover(self.sessions, self._hand_over) if self.sessions is not None else None
        )
        self.queue = (
            PromptQueue(
                coordinator,
                self.sessions,
                self.turns,
                record=self.record,
                changed=self._queue_changed,
                open_runner=self._open_runner,
                close_runner=self._close_runner,
            )
            if self.sessions is not None and self.turns is not None
            else None
        )

    # -- connections -----------------------------------------------------------------------

    def open(
        self,
        role: str,
        launch: LaunchContext,
        end: Callable[[], None],
        client_version: str | None = None,
        *,
        client_name: str = "",
        notify: Callable[[dict[str, Any]], None] | None = None,
    ) -> Connection:
        """Register a ``v1_shim`` or ``persistent`` connection; ``end`` stops its input.

        ``client_version`` (the client's installed package) is what its ``initialize``
        reports as ``server_version``; ``client_name#<connection>`` is its label.
        """
        transports = ("stdio",) if role == "v1_shim" else ("unix",)
        conn = self.coordinator.open_connection(
            launch, transports, client_version, persistent=role == "persistent"
        )
        conn.label = f"{client_name or 'client'}#{conn.conn_id}"
        self._clients[conn.conn_id] = Registration(conn, role, end, notify)
        return conn

    def lost(self, conn: Connection) -> None:
        """The client is gone (its transport was lost): from now on its sessions may be
        taken over, even while a request it sent earlier is still being handled."""
        reg = self._clients.get(conn.conn_id)
        if reg is not None and not reg.lost:
            reg.lost = True
            self.watchers.remove_all(conn.conn_id)
            if self.handover is not None:
                self.handover.requester_gone(conn.conn_id)
                if reg.role == "persistent":
                    self.handover.controller_lost(conn.conn_id)

    async def close(self, conn: Connection) -> None:
        """The connection ended: drain (v1 shim) or detach (persistent) its work."""
        reg = self._clients[conn.conn_id]
        detach = reg.role == "persistent" and not self.draining
        self.lost(conn)
        try:
            await self.coordinator.close_connection(conn, detach=detach)
        finally:
            self._clients.pop(conn.conn_id, None)
            reg.closed.set()

    def _is_lost(self, conn_id: int) -> bool:
        """A lost persistent client, or a queue runner: its sessions are takeable."""
        reg = self._clients.get(conn_id)
        return reg is not None and reg.lost and reg.role in ("persistent", "queue")

    def _open_runner(self, launch: Launch, session_id: str) -> Connection:
        """A queue runner (``core.queue``): a connection of the daemon's own that starts
        one queued turn of ``session_id``; registered as lost (no client, takeable)."""
        conn = self.coordinator.open_connection(launch.ctx, ("unix",), persistent=True)
        conn.initialized = True
        conn.approvals = launch.approvals
        conn.queue_of = session_id
        conn.label = f"queue#{conn.conn_id}"
        self._clients[conn.conn_id] = Registration(conn, "queue", lambda: None, lost=True)
        return conn

    async def _close_runner(self, conn: Connection) -> None:
        reg = self._clients[conn.conn_id]
        try:
            await self.coordinator.close_connection(conn)
        finally:
            self._clients.pop(conn.conn_id, None)
            reg.closed.set()

    def _queue_changed(self, session_id: str, entries: list[dict[str, str]]) -> None:
        self.watchers.session(
            session_id, {"event": "queue_changed", "session_id": session_id, "entries": entries}
        )

    # -- idle accounting and owner drop ----------------------------------------------------

    def busy(self) -> bool:
        return bool(self._clients) or (self.turns is not None and bool(self.turns.active))

    def idle_for(self) -> float:
        """Seconds since the service was last seen busy (0 while it is)."""
        now = self._clock()
        if self.busy():
            self._last_busy = now
        return now - self._last_busy

    async def drain(self, grace: float) -> None:
        """Owner drop: cancel every turn, end every connection, wait for their drain."""
        self.draining = True
        if self.turns is not None:
            for run in list(self.turns.active.values()):
                run.cancel()
        registrations = list(self._clients.values())
        for reg in registrations:
            reg.end()
        waiters = [asyncio.ensure_future(reg.closed.wait()) for reg in registrations]
        if waiters:
            _, pending = await asyncio.wait(waiters, timeout=grace)
            for waiter in pending:
                waiter.cancel()
            if pending:
                log.warning("owner drop: %d connections did not drain in time", len(pending))

    def counts(self) -> dict[str, int]:
        active = self.turns.active if self.turns is not None else {}
        return {
            "clients": sum(1 for reg in self._clients.values() if not reg.lost),
            "active_turns": len(active),
            "max_active_turns_per_client": MAX_ACTIVE_TURNS,
            "max_active_turns": MAX_SERVICE_TURNS,
            # Detached: its session's controller is a lost persistent client.
            "detached_turns": sum(
                1 for run in active.values() if self._is_lost(run.attachment.owner)
            ),
        }

    def holdings(self) -> dict[str, int]:
        """What the daemon keeps beyond running turns (``status`` only: not on a hot path)."""
        return {
            "retained_turns": self.journal.retained(),
            "retained_turn_bytes": self.journal.retained_bytes(),
            "sessions_held": self.sessions.held() if self.sessions is not None else 0,
        }

    # -- the journal, snapshot and attach --------------------------------------------------

    def record(self, event: TurnEvent) -> None:
        """A turn event as its connection's writer takes it (both roles): the journal,
        then the session's watchers."""
        self.journal.record(event)
        self.watchers.turn(event, _turn_started(event) if event.name == "turn.started" else None)

    def snapshot(self, query: SnapshotQuery) -> tuple[list[dict[str, Any]], str | None]:
        """One page of turns (raises :class:`~magi_code.core.journal.BadCursor`)."""
        return self.journal.snapshot(query)

    async def attach(
        self,
        turn_id: str,
        after: int,
        session_id: str | None,
        deliver: Callable[[TurnEvent], None],
    ) -> tuple[str, list[dict[str, Any]], str | None]:
        """``(status, event envelopes, failure label)``; raises ServiceError
        ``unknown_turn``/``session_busy``.

        A turn in the journal is answered (and followed) before any await, so the caller
        can send the answer before any later live event of that turn.
        """
        answer = self.journal.attach(turn_id, after, deliver)
        if answer is not None:
            status, events = answer
            return status, [event.envelope for event in events], self.journal.failure(turn_id)
        if session_id is None or self.sessions is None:
            raise ServiceError(ErrorCode.UNKNOWN_TURN)
        session_id = validate_session_id(session_id)
        if self.turns is not None and turn_id in self.turns.active:
            # Running here but not journaled yet (its acceptance is not written).
            raise ServiceError(ErrorCode.SESSION_BUSY)
        terminal, failure = await self._durable_terminal(session_id, turn_id)
        return "finished", [terminal], failure

    async def _durable_terminal(
        self, session_id: str, turn_id: str
    ) -> tuple[dict[str, Any], str | None]:
        assert self.sessions is not None
        outcome = await asyncio.to_thread(self.sessions.store.turn_outcome, session_id, turn_id)
        if outcome is None:
            raise ServiceError(ErrorCode.UNKNOWN_TURN)
        if outcome.status is None:
            # Its service died mid-turn: record the turn as failed (repairing the tail),
            # under this daemon's attachment of the session if a client holds one.
            outcome = await self.sessions.close_interrupted_turn(session_id, turn_id)
            if outcome is None or outcome.status is None:
                raise ServiceError(ErrorCode.UNKNOWN_TURN)
            log.info("recovered the outcome of an interrupted turn")
        status: str = outcome.status
        failure = outcome.failure
        if failure not in failures.REMEDIES:
            failure = None  # none recorded (an older version's), or one this one lacks
        if failure is None and status == "failed" and outcome.sequence is None:
            # Only the interrupted-turn repair writes a terminal no event carried (here or
            # when a service took the session's lease).
            failure = failures.INTERRUPTED
        if status == "compaction_required":
            # A session-record status only: on the wire the turn failed, as it did live.
            status, failure = "failed", failure or failures.CONTEXT_LENGTH
        payload = {
            "turn_id": turn_id,
            "session_id": session_id,
            "status": status,
            "assistant_text": outcome.assistant_text,
            "sequence": RECOVERED_SEQUENCE if outcome.sequence is None else outcome.sequence,
            "activity_dropped": 0,
            "activity_replay_available": False,
            "replay_required": True,
        }
        if status != "failed":
            failure = None
        elif failure is not None:
            recorded = outcome.remedy if failure == outcome.failure else None
            payload["failure"] = failure
            payload["remedy"] = _recorded_remedy(recorded, failure)
        event_id = self.coordinator.next_event_id()
        terminal = envelope.event(event_id, None, session_id, "turn.terminal", payload)
        return terminal, failure

    # -- control grants --------------------------------------------------------------------

    async def take_control(
        self, conn: Connection, session_id: object
    ) -> tuple[str, list[dict[str, Any]]]:
        """Make ``conn`` the session's controller; ``(session_id, running turns)``."""
        if not conn.initialized:
            raise ServiceError(ErrorCode.NOT_INITIALIZED)
        if self.sessions is None or self.turns is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        valid = validate_session_id(session_id)
        before = self.sessions.controller(valid)
        owner = None if before is None else before.owner
        attachment = await self.sessions.take(conn, valid, self._is_lost)
        if owner != conn.conn_id:
            self.control_changed(valid, conn.label)
        if self.queue is not None:
            self.queue.served(conn, valid)
        return valid, self._running(attachment)

    def _running(self, attachment: Attachment) -> list[dict[str, Any]]:
        assert self.turns is not None
        return [
            {"turn_id": run.turn_id, "sequence": self.journal.sequence(run.turn_id)}
            for run in self.turns.active.values()
            if run.attachment is attachment
        ]

    async def request_control(
        self, conn: Connection, session_id: object
    ) -> tuple[str, list[dict[str, Any]]]:
        """``control.request``: as ``take_control`` when the session is free, lost or
        released; else ask its controller and wait (raises ``Refused``)."""
        if not conn.initialized:
            raise ServiceError(ErrorCode.NOT_INITIALIZED)
        if self.sessions is None or self.handover is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        valid = validate_session_id(session_id)
        held = self.sessions.controller(valid)
        if (
            held is not None
            and held.owner != conn.conn_id
            and not held.released
            and not self._is_lost(held.owner)
        ):
            reg = self._clients.get(held.owner)
            notify = None if reg is None else reg.notify

            def ask(frame: dict[str, Any]) -> bool:
                if notify is None:
                    return False  # a v1 shim's hold is never handed over
                notify(frame)
                event = {k: v for k, v in frame.items() if k != "t"}
                self.watchers.session(valid, {"event": "control_requested", **event})
                return True

            await self.handover.request(conn, valid, ask)
        return await self.take_control(conn, valid)

    def _hand_over(self, attachment: Attachment, conn: Connection) -> None:
        assert self.sessions is not None
        previous = self._clients.get(attachment.owner)
        self.sessions.hand_over(attachment, conn)
        if previous is not None and previous.notify is not None and not previous.lost:
            previous.notify(v2.control_changed(attachment.session_id, conn.label))
        self.control_changed(attachment.session_id, conn.label)

    def control_changed(self, session_id: str, controller: str | None) -> None:
        self.watchers.session(
            session_id,
            {"event": "control_changed", "session_id": session_id, "controller": controller},
        )

    async def release_control(self, conn: Connection, session_id: object) -> str:
        if self.sessions is None or self.handover is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        valid = validate_session_id(session_id)
        if await self.sessions.release_control(conn, valid):
            self.control_changed(valid, None)
            self.handover.released(valid)
        return valid

    # -- steering --------------------------------------------------------------------------

    def steer(
        self, conn: Connection, turn_id: str, text: str
    ) -> tuple[asyncio.Future[bool], asyncio.Future[str | None] | None]:
        """``turn.steer`` (RFC-0002 §6.10), taken before it returns: ``(entered, late)``.
        ``entered`` is true once the text entered the running turn, false
        (``turn_finished``) when the turn ended first — also when it had already ended and
        ``conn`` controls its session; then ``late`` is the queue entry the text became at
        the head of the session's queue (§6.12; None when the queue could not take it).
        Raises ServiceError ``unknown_turn``."""
        if self.turns is None or self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        run = self.turns.active.get(turn_id)
        if run is None:
            info = self.journal.ended(turn_id)
            held = None if info is None else self.sessions.controller(info.session_id)
            if info is None or held is None or held.owner != conn.conn_id:
                raise ServiceError(ErrorCode.UNKNOWN_TURN)
            session_id = info.session_id
            entered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            entered.set_result(False)
        else:
            session_id = run.session_id
            entered = self.turns.steer(conn, turn_id, text)
        late = None if self.queue is None else self.queue.late(conn, session_id, text, entered)
        return entered, late

    # -- watchers --------------------------------------------------------------------------

    async def watch(
        self, conn: Connection, session_id: object, after: str | None, sink: WatchSink
    ) -> tuple[str, list[dict[str, Any]], str, bool]:
        """Register ``sink`` and answer ``(session_id, history items, cursor before the
        first, gap)``; the caller sends them before anything ``sink`` holds.

        Raises ServiceError (``invalid_session_id``, ``session_unavailable``,
        ``limit_exceeded``) or :class:`StaleCursor`.
        """
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        valid = validate_session_id(session_id)
        self.watchers.remove(valid, conn.conn_id)  # a new watch replaces the old
        self.watchers.add(valid, conn.conn_id, sink)
        # Turns already running here are handed over from their first buffered event.
        for log_ in self.journal.running(valid):
            sink.live.add(log_.info.turn_id)
            sink.session(_turn_started(log_.events[0]) | {"complete": log_.evicted_upto < 0})
            for event in log_.events:
                sink.turn(event)
        # And their approval requests still waiting (settled ones arrive as resolved).
        for asked in self.approvals.pending_events(valid):
            sink.session(asked)
        try:
            history = await asyncio.to_thread(self.sessions.store.history, valid, after)
            if history is None:
                raise StaleCursor
            items = history_before_live(history, sink.live)
            if len(items) > MAX_WATCH_HISTORY_ITEMS:
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
        except BaseException:
            self.watchers.remove(valid, conn.conn_id)
            raise
        bodies = [{"cursor": item.cursor, **item.body} for item in items]
        if self.queue is not None:
            self.queue.served(conn, valid)
        return valid, bodies, history.before, history.gap

    # -- the session library (RFC-0002 §6.11) ---------------------------------------------

    async def session_library(self, query: LibraryQuery) -> dict[str, Any]:
        """A library page. Raises :class:`BadCursor`, or ServiceError
        (``session_unavailable``)."""
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        return await asyncio.to_thread(self.sessions.store.library, query)

    async def transcript(self, session_id: str, start: int, project: Path) -> dict[str, Any]:
        """A page of the session's conversation with its tool calls (RFC-0002 §6.14) from
        item ``start``; tool call paths relative to ``project``. Raises ServiceError
        (``invalid_session_id``, ``session_unavailable``, ``session_busy``)."""
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        transcript = await asyncio.to_thread(self.sessions.store.transcript, session_id)
        return await asyncio.to_thread(transcript_page, transcript, start, project)

    async def select(
        self, ctx: LaunchContext, session_id: str, selection: Layer | None
    ) -> dict[str, object]:
        """Give the session its own selection and reasoning (RFC-0002 §6.15; None: the
        settings' again) once the catalog allows it; what its turns started from ``ctx``
        get now. Raises ServiceError (``invalid_session_id``, ``invalid_selection``,
        ``catalog_unavailable``, ``catalog_stale``, ``unsupported_reasoning``,
        ``configuration_unavailable``, ``limit_exceeded``)."""
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        validate_session_id(session_id)
        if selection is not None:
            await asyncio.to_thread(check_session_selection, ctx, selection)
        if not self.sessions.set_selection(session_id, selection):
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)

        def effective() -> Effective:
            return resolve_effective(ctx, load_settings(ctx), session=selection)

        now = await asyncio.to_thread(effective)
        return {
            "provider_id": now.provider_id,
            "model_id": now.model_id,
            "thinking_level": now.thinking_level,
            "available_thinking_levels": list(now.available_thinking_levels),
        }

    async def change_session(
        self, kind: str, session_id: str, title: str | None
    ) -> dict[str, object]:
        """``session_rename`` (``title``), ``session_archive`` or ``session_unarchive``:
        the session's library entry after the change. Raises ValueError (a title with
        nothing displayable) or ServiceError (``invalid_session_id``,
        ``session_unavailable``, ``session_busy``)."""
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        store = self.sessions.store
        if title is not None:
            item = await asyncio.to_thread(store.rename, session_id, title)
            self.watchers.session(
                str(item["session_id"]),
                {
                    "event": "title_changed",
                    "session_id": item["session_id"],
                    "title": item["title"],
                },
            )
            return item
        archived = kind == "session_archive"
        return await asyncio.to_thread(store.set_archived, session_id, archived)

    # -- fork and rewind (RFC-0002 §6.16) ------------------------------------------------

    async def fork_session(self, session_id: str, cursor: str) -> dict[str, object]:
        """A new session with the history up to ``cursor``; its library entry. A read of
        the original: it needs no control. Raises ServiceError (the v1 session errors),
        :class:`StaleCursor` or :class:`NotTurnBoundary`."""
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        return await asyncio.to_thread(self.sessions.store.fork, session_id, cursor)

    async def rewind_session(
        self, conn: Connection, session_id: str, cursor: str, files: bool, commit: bool, force: bool
    ) -> dict[str, Any]:
        """``session.rewind``'s answer: its preview (a read), or with ``commit`` the
        rewind itself, under the session's lease (control: ``session_busy`` while another
        client holds it; :class:`TurnRunning` while a turn runs on it). Watchers are told
        ``rewound``. Raises as :meth:`fork_session` too."""
        if self.sessions is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        store = self.sessions.store
        valid = validate_session_id(session_id)
        if not commit:
            plan = await asyncio.to_thread(plan_rewind, store, valid, cursor)
            return rewind_answer(plan, None, files)
        try:
            async with self.sessions.claimed(conn, valid) as lease:
                plan, results = await asyncio.to_thread(
                    commit_rewind, store, lease, cursor, files, force
                )
        finally:
            if self.queue is not None:  # a queued turn held off meanwhile starts now
                self.queue.kick(valid)
        answer = rewind_answer(plan, results, files)
        self.watchers.session(valid, {"event": "rewound", "session_id": valid, "to_cursor": cursor})
        return answer


def transcript_page(transcript: Transcript, start: int, project: Path) -> dict[str, object]:
    """Items ``start`` on of the transcript's conversation, as many as fit a page (at
    least one). Blocking (a tool call's detail resolves its paths)."""
    items: list[dict[str, object]] = []
    size, index, more = 0, 0, False
    for index, entry in enumerate(transcript.conversation()):
        if index < start:
            continue
        if isinstance(entry, tuple):
            call, is_error = entry
            detail = call_detail(call.name, call.arguments, project) or {
                "tool": call.name,
                "arguments": {},
                "truncated": True,
                "locations": [],
            }
            status = "no_result" if is_error is None else "failed" if is_error else "completed"
            item: dict[str, object] = {
                "kind": "tool_call",
                "turn_id": call.turn_id,
                "call_id": call.call_id,
                "call": detail,
                "status": status,
            }
        else:
            item = entry.body
        size += len(orjson.dumps(item))
        if items and size > MAX_TRANSCRIPT_PAGE_BYTES:
            more = True
            break
        items.append(item)
    return {
        "items": items,
        "next_cursor": str(index) if more else None,
        "gap": transcript.gap,
    }


def _turn_started(event: TurnEvent) -> dict[str, Any]:
    info = event.info
    return {
        "event": "turn_started",
        "session_id": info.session_id,
        "turn_id": info.turn_id,
        "by": info.started_by,
        "prompt": info.prompt,
    }


def _recorded_remedy(recorded: str | None, label: str) -> str:
    """A session record's remedy when it is one bounded line, else the table's."""
    if (
        recorded is not None
        and "\n" not in recorded
        and len(recorded.encode()) <= failures.MAX_REMEDY_BYTES
    ):
        return recorded
    return failures.remedy(label)
