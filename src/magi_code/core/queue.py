"""The prompt queue (RFC-0002 §6.12): prompts a session runs one after another as turns.

Each session's queue is durable (``sessions.queue``: the session's ``queue.json``). Its
controller adds, removes, moves and sends entries; anyone may list them. Whenever the
session is free here — no turn runs on it, and no v1 client holds it — the queue's head
runs as a **normal turn**: a *queue runner* connection of the daemon's own (one per
queued turn, labelled ``queue#<n>``) sends the coordinator an ordinary ``turn.start`` with
the entry's ID as its idempotency key, so admission, events, the journal, watchers,
snapshot, attach and replay are those of every turn. The runner starts the turn on the
controller's attachment when a client holds the session (the controller may cancel or
steer it), else on an implicit attachment of its own, which any persistent client may
take (§6.1) like a lost client's. The entry leaves the queue once the turn is accepted;
a restart between the two repeats the key, which starts nothing.

What a queued turn runs with: the launch context (project, environment, umask) and
approvals option of the connection that queued it, held in memory only (the
environment may hold secrets and is never written). Entries whose context is gone — a
daemon restart — run with the context of the next persistent connection that serves
the session here: takes its lease (``session.open``, ``take_control``, a turn on it),
watches it or lists or changes its queue. So the queue resumes when the daemon next
serves the session; until then it waits on disk.

Triggers: an entry added or moved, a turn of the session finished, the session served.
No queued turn starts while the daemon stops or waits to restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

from magi_code.dataclass import dataclass, field
from magi_code.protocol import envelope
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.ids import validate_session_id
from magi_code.sessions.queue import (
    MAX_QUEUE_ENTRIES,
    MAX_QUEUE_TOTAL_BYTES,
    QueueEntry,
)
from magi_code.sessions.records import now_rfc3339
from magi_code.storage.launch import LaunchContext

from .coordinator import Connection, ServiceCoordinator
from .output import TurnEvent
from .sessions import SessionService
from .turns import TurnService

log = logging.getLogger(__name__)

NOT_CONTROLLER: Final = "not_controller"
UNKNOWN_ENTRY: Final = "unknown_entry"
TURN_FINISHED: Final = "turn_finished"
# Sessions remembered as having an empty queue (forgotten all at once past it), and the
# sessions whose state is kept before the idle ones known empty are dropped.
MAX_KNOWN_EMPTY: Final = 4096


class QueueRefused(Exception):
    """A queue frame answered with ``code`` (a v2 ``queue_error``)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True, slots=True)
class Launch:
    """What a queued turn runs with: a connection's launch context and approvals option."""

    ctx: LaunchContext
    approvals: bool


@dataclass(eq=False, slots=True)
class _Session:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Entries being sent into the running turn (``queue_send_now``): nothing runs
    # meanwhile, so one that does not enter is moved to the head before anything runs.
    sending: set[str] = field(default_factory=set)
    # Late steers on their way to the head: nothing runs before they are there.
    returning: int = 0
    runner: asyncio.Task[None] | None = None


class PromptQueue:
    """The daemon's prompt queues. ``open_runner`` and ``close_runner`` make and end a
    queue runner connection (the persistent coordinator registers it like a lost client:
    counted as no client, its sessions takeable)."""

    def __init__(
        self,
        coordinator: ServiceCoordinator,
        sessions: SessionService,
        turns: TurnService,
        *,
        record: Callable[[TurnEvent], None],
        changed: Callable[[str, list[dict[str, str]]], None],
        open_runner: Callable[[Launch, str], Connection],
        close_runner: Callable[[Connection], Awaitable[None]],
    ) -> None:
        self.coordinator = coordinator
        self.sessions = sessions
        self.turns = turns
        self._record = record
        self._changed = changed
        self._open_runner = open_runner
        self._close_runner = close_runner
        # No queued turn starts while this says so (the daemon stops or restarts).
        self.hold: Callable[[], bool] = lambda: False
        self._sessions: dict[str, _Session] = {}
        # Per entry: the launch of the connection that queued it (memory only).
        self._launch: dict[str, Launch] = {}
        # Per session: the launch of the last persistent connection that served it.
        self._served: dict[str, Launch] = {}
        self._tasks: set[asyncio.Task[str | None]] = set()
        # Sessions whose queue this daemon read empty since its last change (only a
        # daemon writes queues): a turn's end or start there reads no file.
        self._empty: set[str] = set()
        sessions.served = self.served
        turns.ended = self.kick

    # -- what the controller and others do -------------------------------------------------

    def _controls(self, conn: Connection, session_id: str) -> None:
        held = self.sessions.controller(session_id)
        if held is None or held.owner != conn.conn_id:
            raise QueueRefused(NOT_CONTROLLER)

    def _state(self, session_id: str) -> _Session:
        state = self._sessions.get(session_id)
        if state is None:
            if len(self._sessions) >= MAX_KNOWN_EMPTY:
                self._forget_idle()
            state = self._sessions[session_id] = _Session()
        return state

    def _forget_idle(self) -> None:
        """Drop the state of sessions known empty that nothing uses now."""
        for session_id in [s for s in self._empty if s in self._sessions]:
            state = self._sessions[session_id]
            if _idle(state) and (state.runner is None or state.runner.done()):
                del self._sessions[session_id]

    async def entries(self, conn: Connection, session_id: object) -> tuple[str, list[QueueEntry]]:
        valid = validate_session_id(session_id)
        entries = await asyncio.to_thread(self.sessions.store.queue, valid)
        self.served(conn, valid)
        return valid, entries

    async def add(
        self, conn: Connection, session_id: object, text: str
    ) -> tuple[str, list[QueueEntry], str]:
        """Queue ``text`` at the tail: ``(session_id, entries, the new entry's ID)``."""
        valid = validate_session_id(session_id)
        self._controls(conn, valid)
        entry = self._entry(conn, text)
        entries = await self._change(valid, lambda es: _bounded([*es, entry]))
        self._launch[entry.entry_id] = _launch_of(conn)
        self.served(conn, valid)
        return valid, entries, entry.entry_id

    def late(
        self, conn: Connection, session_id: str, text: str, entered: asyncio.Future[bool]
    ) -> asyncio.Future[str | None]:
        """A steer's text goes to the head of the queue if it does not enter its turn
        (§6.10): the future is the entry's ID, None when it entered or the queue could not
        take it (full, unwritable: the client keeps the text). Done however the steering
        connection fares; the queue runs nothing until the text is there."""
        outcome: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        launch = _launch_of(conn)

        def settled(future: asyncio.Future[bool]) -> None:
            if future.result():
                outcome.set_result(None)
                return
            self._state(session_id).returning += 1
            task = asyncio.create_task(self._put_back(session_id, text, conn.label, launch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(lambda t: outcome.set_result(t.result()))

        entered.add_done_callback(settled)
        return outcome

    async def _put_back(self, session_id: str, text: str, by: str, launch: Launch) -> str | None:
        entry = QueueEntry(_entry_id(), text, by, now_rfc3339())
        try:
            await self._change(session_id, lambda es: _bounded([entry, *es]))
        except (QueueRefused, ServiceError):
            return None
        else:
            self._launch[entry.entry_id] = launch
            return entry.entry_id
        finally:
            self._state(session_id).returning -= 1
            self.kick(session_id)

    async def remove(
        self, conn: Connection, session_id: object, entry_id: str
    ) -> tuple[str, list[QueueEntry]]:
        valid = validate_session_id(session_id)
        self._controls(conn, valid)

        def change(entries: list[QueueEntry]) -> list[QueueEntry]:
            kept = [e for e in entries if e.entry_id != entry_id]
            if len(kept) == len(entries) or entry_id in self._state(valid).sending:
                raise QueueRefused(UNKNOWN_ENTRY)
            return kept

        entries = await self._change(valid, change)
        self._launch.pop(entry_id, None)
        return valid, entries

    async def move(
        self, conn: Connection, session_id: object, entry_id: str, index: int
    ) -> tuple[str, list[QueueEntry]]:
        """Move the entry to ``index`` (0 is the head; past the tail is the tail)."""
        valid = validate_session_id(session_id)
        self._controls(conn, valid)
        entries = await self._change(valid, lambda es: _moved(es, entry_id, index))
        self.kick(valid)
        return valid, entries

    async def send_now(
        self, conn: Connection, session_id: object, entry_id: str
    ) -> tuple[str, list[QueueEntry]]:
        """Steer the entry into the session's running turn (§6.10) and drop it once it
        entered; with no turn running, move it to the head (it runs next, now). Raises
        :class:`QueueRefused` ``turn_finished`` when the turn ended before the text
        entered: the entry is then at the head."""
        valid = validate_session_id(session_id)
        self._controls(conn, valid)
        entries = await asyncio.to_thread(self.sessions.store.queue, valid)
        state = self._state(valid)  # after the read: an idle state may go meanwhile
        entry = next((e for e in entries if e.entry_id == entry_id), None)
        if entry is None or entry_id in state.sending:
            raise QueueRefused(UNKNOWN_ENTRY)
        running = [
            run
            for run in self.turns.active.values()
            if run.session_id == valid and run.attachment.owner == conn.conn_id
        ]
        if not running:
            return await self.move(conn, valid, entry_id, 0)
        state.sending.add(entry_id)
        try:
            try:
                entered = await self.turns.steer(conn, running[0].turn_id, entry.text)
            except ServiceError:
                entered = False
            if entered:
                entries = await self._change(
                    valid, lambda es: [e for e in es if e.entry_id != entry_id]
                )
                self._launch.pop(entry_id, None)
            else:
                await self._change(valid, lambda es: _moved(es, entry_id, 0))
        finally:
            state.sending.discard(entry_id)
            self.kick(valid)
        if not entered:
            raise QueueRefused(TURN_FINISHED)
        return valid, entries

    def _entry(self, conn: Connection, text: str) -> QueueEntry:
        return QueueEntry(_entry_id(), text, conn.label, now_rfc3339())

    async def _change(
        self, session_id: str, change: Callable[[list[QueueEntry]], list[QueueEntry] | None]
    ) -> list[QueueEntry]:
        """One change of the durable queue, serialized per session; watchers are told."""
        async with self._state(session_id).lock:
            self._empty.discard(session_id)
            before: list[QueueEntry] = []

            def apply(entries: list[QueueEntry]) -> list[QueueEntry] | None:
                before.extend(entries)
                return change(entries)

            entries = await asyncio.to_thread(self.sessions.store.change_queue, session_id, apply)
        if entries != before:
            self._changed(session_id, [e.item() for e in entries])
        return entries

    # -- running the queue -----------------------------------------------------------------

    def served(self, conn: Connection, session_id: str) -> None:
        """A persistent connection serves the session here: its queue resumes (with this
        connection's launch for entries that have none)."""
        if conn.persistent and conn.queue_of is None and session_id not in self._empty:
            self._served[session_id] = _launch_of(conn)
            self.kick(session_id)

    def kick(self, session_id: str) -> None:
        """Run the session's queue unless it runs already."""
        if session_id in self._empty:
            return
        state = self._state(session_id)
        if state.runner is None or state.runner.done():
            state.runner = asyncio.create_task(self._drain(session_id))

    async def _drain(self, session_id: str) -> None:
        try:
            while await self._run_next(session_id):
                pass
        except Exception:
            log.exception("the prompt queue stopped")
        finally:
            # An idle state is as good as a new one: it goes with its runner, or every
            # session that ever ended a turn here would keep one (and the runner's task).
            state = self._sessions.get(session_id)
            if state is not None and state.runner is asyncio.current_task() and _idle(state):
                del self._sessions[session_id]

    async def _run_next(self, session_id: str) -> bool:
        """Start the head entry and wait for its turn; whether to go on."""
        state = self._state(session_id)
        if self.hold() or state.returning or state.sending or not self._free(session_id):
            return False
        async with state.lock:  # a change (which forgets ``_empty``) goes before or after
            try:
                entries = await asyncio.to_thread(self.sessions.store.queue, session_id)
            except ServiceError:
                return False
            if not entries and not state.returning:
                if len(self._empty) >= MAX_KNOWN_EMPTY:
                    self._empty.clear()
                self._empty.add(session_id)
                self._served.pop(session_id, None)
        if not entries:
            return False
        entry = entries[0]
        launch = self._launch.get(entry.entry_id) or self._served.get(session_id)
        if launch is None:
            return False  # it waits to be served (after a restart)
        if self.hold() or not self._free(session_id):  # again, after the read
            return False
        conn = self._open_runner(launch, session_id)
        ended = asyncio.Event()
        writer = asyncio.create_task(self._write(conn, ended))
        try:
            return await self._run(conn, session_id, entry, ended)
        finally:
            await self._close_runner(conn)  # its output ends: so does the writer
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    def _free(self, session_id: str) -> bool:
        held = self.sessions.controller(session_id)
        if held is None:
            return True
        owner = self.coordinator.connections.get(held.owner)
        # A v1 client's session runs only its own turns (its stream has no queue).
        return not held.busy and not (owner is not None and owner.speaks_stdio)

    async def _run(
        self, conn: Connection, session_id: str, entry: QueueEntry, ended: asyncio.Event
    ) -> bool:
        request_id = f"queue-{entry.entry_id}"
        message = envelope.request(request_id, "turn.start", {"prompt": entry.text}, session_id)
        batch = await self.coordinator.handle_message(conn, message, idempotency_key=entry.entry_id)
        assert batch is not None  # turn.start answers on the coordinator
        response = batch.messages[0]
        if response.get("error") is not None:
            log.info("a queued turn was not started (%s)", response["error"].get("code"))
            return False
        run = self.turns.active.get(response["payload"]["turn_id"])
        await self._change(session_id, lambda es: [e for e in es if e != entry])
        self._launch.pop(entry.entry_id, None)
        if run is not None and run.conn is conn:  # else a repeat: that turn ran before
            await ended.wait()
            if run.task is not None:
                # Until its attachment is settled: the next entry finds the session free.
                await asyncio.wait({run.task})
        return True

    async def _write(self, conn: Connection, ended: asyncio.Event) -> None:
        """The runner's output: its turn's events go to the journal and the watchers."""
        while (batch := await conn.output.get()) is not None:
            for event in batch.turn_events:
                self._record(event)
            batch.written()
            if any(event.name == "turn.terminal" for event in batch.turn_events):
                ended.set()


def _idle(state: _Session) -> bool:
    """Nothing holds or waits for the state's lock, sends or returns an entry."""
    return not state.lock.locked() and not state.sending and not state.returning


def _entry_id() -> str:
    return f"q_{secrets.token_hex(8)}"


def _launch_of(conn: Connection) -> Launch:
    return Launch(conn.ctx, conn.approvals)


def _bounded(entries: list[QueueEntry]) -> list[QueueEntry]:
    if len(entries) > MAX_QUEUE_ENTRIES:
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    if sum(len(e.text.encode()) for e in entries) > MAX_QUEUE_TOTAL_BYTES:
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    return entries


def _moved(entries: list[QueueEntry], entry_id: str, index: int) -> list[QueueEntry]:
    entry = next((e for e in entries if e.entry_id == entry_id), None)
    if entry is None:
        raise QueueRefused(UNKNOWN_ENTRY)
    rest = [e for e in entries if e is not entry]
    rest.insert(min(index, len(rest)), entry)
    return rest
