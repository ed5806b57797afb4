"""The ``persistent`` role (RFC-0002 §6): v1 requests whose turns survive the client.

Requests are handled in order; a decoded request goes to the coordinator as a map (no
JSON round trip). The connection's output never waits for the client: its writer hands
every batch to :class:`~magi_code.daemon.outbound.Outbound` (bounded, coalescing, cut on
overload) and feeds turn events to the persistent coordinator's journal, also after the
client is gone, so detached turns keep their replay buffers.

Answers that could outgrow one frame are split: ``snapshot`` pages by cursor, and a
long ``attach`` answer continues in ``attach_more`` frames, all sent in the same loop step
as the attachment, so every buffered event precedes any live event of that turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, cast

import msgpack

from magi_code.config.approvals import Policy
from magi_code.config.settings import Layer
from magi_code.core.approvals import UnknownApproval
from magi_code.core.coordinator import Connection
from magi_code.core.handover import Refused
from magi_code.core.journal import BadCursor, SnapshotQuery
from magi_code.core.output import TurnEvent
from magi_code.core.queue import QueueRefused
from magi_code.core.routes import RequestExpired
from magi_code.core.sessions import TurnRunning
from magi_code.core.watch import StaleCursor
from magi_code.protocol import v2
from magi_code.protocol.deadlines import deadline_passed
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.frames import FrameError
from magi_code.protocol.v2 import Code
from magi_code.sessions.listing import BadCursor as BadLibraryCursor
from magi_code.sessions.listing import LibraryQuery
from magi_code.sessions.store import NotTurnBoundary
from magi_code.sessions.store import StaleCursor as StoreStaleCursor

from .control_role import answer_control
from .outbound import Outbound

if TYPE_CHECKING:
    from .connection import PeerConnection

log = logging.getLogger("magi_code.daemon")

# Events per attach frame are packed up to this many bytes (a frame holds 1 MiB).
ATTACH_PART_BYTES: Final = 512 * 1024
# What a fork or rewind that cannot go ahead is answered (§6.16).
_FORK_ERRORS: Final[dict[type[Exception], Code]] = {
    StoreStaleCursor: Code.RESYNC_REQUIRED,
    NotTurnBoundary: Code.NOT_TURN_BOUNDARY,
    TurnRunning: Code.TURN_RUNNING,
}


class PersistentRole:
    def __init__(self, peer: PeerConnection, conn: Connection, hello: v2.Hello) -> None:
        self.peer = peer
        self.conn = conn
        self.core = peer.server.core
        self.approvals = self.core.approvals
        self.outbound = Outbound(
            self._write_message,
            peer.send,
            peer.transport.get_write_buffer_size,
            limit=peer.server.outbound_limit,
            interval_ms=hello.delta_interval_ms,
            on_cut=lambda turn_id: self.core.journal.unfollow(turn_id, self._deliver),
        )
        # Control is revoked the moment the client is gone (RFC-0002 §6.1), not only once
        # the requests it sent before have been handled.
        peer.on_lost_hook = lambda: self.core.lost(conn)
        self._requests: set[asyncio.Task[None]] = set()  # control requests waiting
        if hello.approvals:
            # Approval frames are not turn events: sent directly, never cut (§6.7).
            conn.approvals = True
            label = f"{hello.client_name or 'client'}#{conn.conn_id}"
            self.approvals.listen(conn.conn_id, peer.send, label)
        # Tool details and editor file requests: also sent directly, never cut (§6.8).
        self.relay = self.core.relay
        self.relay.listen(conn.conn_id, peer.send, hello.tool_details, hello.editor_files)

    async def serve(self) -> None:
        peer, conn = self.peer, self.conn
        peer.send(peer.server.welcome("persistent"))
        writer = asyncio.create_task(self._writer())
        try:
            async for frame in peer.frames():
                if isinstance(frame, v2.Request):
                    await self._request(frame, writer)
                elif isinstance(frame, v2.TakeControl):
                    await self._take_control(frame)
                elif isinstance(frame, v2.Control):
                    answer_control(peer, frame)
                elif isinstance(frame, v2.Snapshot):
                    self._snapshot(frame)
                elif isinstance(frame, v2.ApprovalAnswer):
                    self._answer(frame)
                elif isinstance(frame, v2.GrantsList | v2.GrantsRevoke):
                    await self._grants(frame)
                elif isinstance(frame, v2.FsResult):
                    self.relay.answer(conn.conn_id, frame.fs_id, frame.content, frame.error)
                elif isinstance(frame, v2.SessionPolicy):
                    await self._session_policy(frame)
                elif isinstance(frame, v2.Watch):
                    await self._watch(frame)
                elif isinstance(frame, v2.SessionFrame):
                    await self._session_frame(frame)
                elif isinstance(frame, v2.ControlAnswer):
                    self._control_answer(frame)
                elif isinstance(frame, v2.Steer):
                    self._steer(frame)
                elif isinstance(frame, v2.QueueFrame):
                    if (in_order := self._queue_frame(frame)) is not None:
                        await in_order
                elif isinstance(frame, v2.SessionsList | v2.SessionChange):
                    await self._library(frame)
                elif isinstance(frame, v2.SessionTranscript):
                    await self._transcript(frame)
                elif isinstance(frame, v2.SessionSelection):
                    await self._selection(frame)
                elif isinstance(frame, v2.SessionFork | v2.SessionRewind):
                    await self._fork_or_rewind(frame)
                else:
                    assert isinstance(frame, v2.Attach)
                    await self._attach(frame)
        finally:
            for task in self._requests:
                task.cancel()
            self.core.watchers.remove_all(conn.conn_id)
            self.approvals.unlisten(conn.conn_id)
            self.relay.unlisten(conn.conn_id)
            self.core.journal.forget(self._deliver)
            try:
                await self.core.close(conn)
                await writer
            finally:
                self.outbound.close()

    async def _request(self, frame: v2.Request, writer: asyncio.Task[None]) -> None:
        """Run a request unless its deadline passed first (RFC-0002 §6.4); a turn start
        whose deadline passes during its settings capture is answered alike (§6.6)."""
        if deadline_passed(frame.deadline_ms):
            log.info("request expired before it ran")
            self.peer.send(v2.request_error(frame.request_id, Code.DEADLINE_EXCEEDED))
            return
        try:
            batch = await self.core.coordinator.handle_message(
                self.conn,
                frame.message,
                idempotency_key=frame.idempotency_key,
                deadline_ms=frame.deadline_ms,
                mcp_servers=frame.mcp_servers,
            )
        except RequestExpired:
            log.info("request expired during admission")
            self.peer.send(v2.request_error(frame.request_id, Code.DEADLINE_EXCEEDED))
            return
        if batch is not None:
            await self.conn.answered(batch, writer)

    async def _take_control(self, frame: v2.TakeControl) -> None:
        try:
            session_id, turns = await self.core.take_control(self.conn, frame.session_id)
        except ServiceError as exc:
            self.peer.send(v2.frame_error("grant_error", frame.id, exc.code))
            return
        log.info("control granted")
        self.peer.send(v2.control_granted(frame.id, session_id, turns))
        self.approvals.resend_session(self.conn.conn_id, session_id)

    def _snapshot(self, frame: v2.Snapshot) -> None:
        query = SnapshotQuery(frame.session_id, frame.turn_ids, frame.project_dir, frame.cursor)
        try:
            turns, cursor = self.core.snapshot(query)
        except BadCursor:
            self.peer.send(v2.frame_error("snapshot_error", frame.id, Code.INVALID_REQUEST))
            return
        self.peer.send(v2.snapshot_result(frame.id, turns, cursor))

    async def _attach(self, frame: v2.Attach) -> None:
        try:
            status, events, failure = await self.core.attach(
                frame.turn_id, frame.after_sequence, frame.session_id, self._deliver
            )
        except ServiceError as exc:
            self.peer.send(v2.frame_error("attach_error", frame.id, exc.code))
            return
        # No await from the journal's answer to the last part: live events come after.
        if status == "finished":
            self.outbound.cut.pop(frame.turn_id, None)
        elif status in ("attached", "resync"):
            self.outbound.follow(frame.turn_id)
        parts = _split(events)
        for index, part in enumerate(parts):
            more = index < len(parts) - 1
            if index == 0:
                self.peer.send(v2.attach_result(frame.id, status, part, more, failure))
            else:
                self.peer.send(v2.attach_more(frame.id, part, more))
        if status != "finished":
            # The turn's pending approval requests, again, after its buffered events.
            self.approvals.follow(self.conn.conn_id, frame.turn_id)

    def _answer(self, frame: v2.ApprovalAnswer) -> None:
        try:
            earlier = self.approvals.answer(self.conn.conn_id, frame.approval_id, frame.decision)
        except UnknownApproval:
            self.peer.send(v2.frame_error("approval_error", frame.id, Code.UNKNOWN_APPROVAL))
            return
        if earlier is not None:
            self.peer.send(
                v2.approval_resolved(
                    frame.approval_id,
                    earlier["decision"],
                    earlier["by"],
                    already=True,
                    frame_id=frame.id,
                )
            )

    async def _grants(self, frame: v2.GrantsList | v2.GrantsRevoke) -> None:
        ctx = self.conn.ctx
        try:
            if isinstance(frame, v2.GrantsRevoke):
                if frame.scope == "session":
                    assert frame.session_id is not None
                    await self.approvals.revoke_session(frame.session_id, frame.kind, frame.value)
                else:
                    await self.approvals.revoke_project(ctx, frame.kind, frame.value)
            grants = await self.approvals.grants(ctx, frame.session_id)
        except ServiceError:
            self.peer.send(v2.frame_error("grants_error", frame.id, Code.GRANTS_UNAVAILABLE))
            return
        self.peer.send(v2.grants_result(frame.id, **grants))

    async def _library(self, frame: v2.SessionsList | v2.SessionChange) -> None:
        """The session library (§6.11): a page, or one session's metadata changed."""
        try:
            if isinstance(frame, v2.SessionsList):
                query = LibraryQuery(
                    frame.project_dir, frame.title, frame.archived, frame.cursor, frame.limit
                )
                page = await self.core.session_library(query)
                self.peer.send(v2.sessions_result(frame.id, **page))
                return
            item = await self.core.change_session(frame.kind, frame.session_id, frame.title)
        except (BadLibraryCursor, ValueError):
            self.peer.send(v2.frame_error("session_error", frame.id, Code.INVALID_REQUEST))
            return
        except ServiceError as exc:
            self.peer.send(v2.frame_error("session_error", frame.id, exc.code))
            return
        self.peer.send(v2.session_result(frame.id, item))

    async def _transcript(self, frame: v2.SessionTranscript) -> None:
        """A page of a session's conversation with its tool calls (§6.14)."""
        try:
            page = await self.core.transcript(
                frame.session_id, frame.start, self.conn.ctx.project_dir
            )
        except ServiceError as exc:
            self.peer.send(v2.frame_error("session_error", frame.id, exc.code))
            return
        self.peer.send(v2.transcript_result(frame.id, **page))

    async def _selection(self, frame: v2.SessionSelection) -> None:
        """A session's own selection and reasoning (§6.15)."""
        selection = None
        if frame.provider_id is not None:
            selection = Layer(frame.provider_id, frame.model_id, frame.thinking_level)
        try:
            effective = await self.core.select(self.conn.ctx, frame.session_id, selection)
        except ServiceError as exc:
            self.peer.send(v2.frame_error("session_selection_error", frame.id, exc.code))
            return
        self.peer.send(v2.session_selection_result(frame.id, frame.session_id, effective))

    async def _fork_or_rewind(self, frame: v2.SessionFork | v2.SessionRewind) -> None:
        """Fork a session, or preview or commit a rewind (§6.16)."""
        try:
            if isinstance(frame, v2.SessionFork):
                item = await self.core.fork_session(frame.session_id, frame.at_cursor)
                self.peer.send(v2.session_result(frame.id, item))
                return
            answer = await self.core.rewind_session(
                self.conn, frame.session_id, frame.at_cursor, frame.files, frame.commit, frame.force
            )
        except ServiceError as exc:
            self.peer.send(v2.frame_error("session_error", frame.id, exc.code))
            return
        except (StoreStaleCursor, NotTurnBoundary, TurnRunning) as exc:
            code = _FORK_ERRORS[type(exc)]
            self.peer.send(v2.frame_error("session_error", frame.id, code))
            return
        self.peer.send(v2.rewind_result(frame.id, answer))

    async def _session_policy(self, frame: v2.SessionPolicy) -> None:
        policy = cast(Policy | None, frame.policy)
        if not self.approvals.set_session_policy(frame.session_id, policy):
            self.peer.send(v2.frame_error("approval_error", frame.id, Code.INVALID_REQUEST))
            return
        effective = await self.approvals.effective_policy(self.conn.ctx, frame.session_id)
        self.peer.send(v2.approval_policy_result(frame.id, frame.session_id, policy, effective))

    async def _watch(self, frame: v2.Watch) -> None:
        stream = WatchStream(self, frame.session_id)
        try:
            session_id, items, before, gap = await self.core.watch(
                self.conn, frame.session_id, frame.after_cursor, stream
            )
        except ServiceError as exc:
            self.peer.send(v2.frame_error("watch_error", frame.id, exc.code))
            return
        except StaleCursor:
            self.peer.send(v2.frame_error("watch_error", frame.id, Code.RESYNC_REQUIRED))
            return
        # No await from here on: the history goes out before anything the stream holds.
        parts = _split(items)
        for index, part in enumerate(parts):
            more = index < len(parts) - 1
            if index == 0:
                self.peer.send(v2.watch_result(frame.id, session_id, part, more, before, gap))
            else:
                self.peer.send(v2.watch_more(frame.id, part, more))
        stream.release()

    async def _session_frame(self, frame: v2.SessionFrame) -> None:
        if frame.kind == "unwatch":
            self.core.watchers.remove(frame.session_id, self.conn.conn_id)
            self.peer.send(v2.unwatched(frame.id, frame.session_id))
        elif frame.kind == "control_release":
            try:
                session_id = await self.core.release_control(self.conn, frame.session_id)
            except ServiceError as exc:
                self.peer.send(v2.frame_error("grant_error", frame.id, exc.code))
                return
            self.peer.send(v2.control_released(frame.id, session_id))
        else:
            # It may wait for the controller: other frames are handled meanwhile.
            task = asyncio.create_task(self._request_control(frame))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _request_control(self, frame: v2.SessionFrame) -> None:
        try:
            session_id, turns = await self.core.request_control(self.conn, frame.session_id)
        except Refused:
            self.peer.send(v2.frame_error("grant_error", frame.id, Code.CONTROL_REFUSED))
            return
        except ServiceError as exc:
            self.peer.send(v2.frame_error("grant_error", frame.id, exc.code))
            return
        log.info("control granted on request")
        self.peer.send(v2.control_granted(frame.id, session_id, turns))
        self.approvals.resend_session(self.conn.conn_id, session_id)

    def _steer(self, frame: v2.Steer) -> None:
        try:
            # Taken now, in frame order; answered at the turn's next request boundary
            # (other frames are handled meanwhile).
            entered, late = self.core.steer(self.conn, frame.turn_id, frame.text)
        except ServiceError as exc:
            self.peer.send(v2.frame_error("steer_error", frame.id, exc.code))
            return
        task = asyncio.create_task(self._steered(frame, entered, late))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _steered(
        self,
        frame: v2.Steer,
        entered: asyncio.Future[bool],
        late: asyncio.Future[str | None] | None,
    ) -> None:
        if not await entered:
            # Too late for the turn: the text went to the head of the session's queue
            # (§6.12), or, when the queue could not take it, back to the client.
            entry_id = None if late is None else await asyncio.shield(late)
            self.peer.send(v2.frame_error("steer_error", frame.id, Code.TURN_FINISHED, entry_id))
            return
        self.peer.send(v2.steer_result(frame.id, frame.turn_id))

    def _queue_frame(self, frame: v2.QueueFrame) -> asyncio.Task[None] | None:
        """``queue_send_now`` waits for the running turn's boundary: other frames are
        handled meanwhile (as for a steer); the other queue frames in order."""
        task = asyncio.create_task(self._queue(frame))
        if frame.kind == "queue_send_now":
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
            return None
        return task

    async def _queue(self, frame: v2.QueueFrame) -> None:
        """The prompt queue (§6.12): the entries after the frame's change."""
        queue = self.core.queue
        try:
            if queue is None:
                raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
            added = None
            if frame.kind == "queue_list":
                session_id, entries = await queue.entries(self.conn, frame.session_id)
            elif frame.kind == "queue_add":
                assert frame.text is not None
                session_id, entries, added = await queue.add(
                    self.conn, frame.session_id, frame.text
                )
            else:
                assert frame.entry_id is not None
                if frame.kind == "queue_remove":
                    change = queue.remove(self.conn, frame.session_id, frame.entry_id)
                elif frame.kind == "queue_move":
                    assert frame.index is not None
                    change = queue.move(self.conn, frame.session_id, frame.entry_id, frame.index)
                else:
                    change = queue.send_now(self.conn, frame.session_id, frame.entry_id)
                session_id, entries = await change
        except QueueRefused as exc:
            self.peer.send(v2.frame_error("queue_error", frame.id, exc.code))
            return
        except ServiceError as exc:
            self.peer.send(v2.frame_error("queue_error", frame.id, exc.code))
            return
        items = [entry.item() for entry in entries]
        self.peer.send(v2.queue_result(frame.id, session_id, items, added))

    def _control_answer(self, frame: v2.ControlAnswer) -> None:
        handover = self.core.handover
        if handover is None or not handover.answer(self.conn, frame.session_id, frame.grant):
            self.peer.send(v2.frame_error("grant_error", frame.id, Code.INVALID_REQUEST))
            return
        self.peer.send(v2.control_answered(frame.id, frame.session_id))

    def _deliver(self, event: TurnEvent) -> None:
        """A followed turn's event from the journal."""
        self.outbound.deliver(event)

    def _write_message(self, message: dict[str, Any]) -> None:
        try:
            self.peer.send(v2.message(message))
        except FrameError:
            log.warning("persistent output error")

    async def _writer(self) -> None:
        # Runs until the connection's output ends, also after the client is gone: detached
        # turns keep feeding the journal (their replay buffer) through it.
        while (batch := await self.conn.output.get()) is not None:
            self.outbound.own(batch, self.core.record)
            batch.written()


class WatchStream:
    """One watched session's frames to this connection: held until the watch's history
    is sent, then written. Bounded by the outbound limit like turn events (§6.2): a
    frame that meets a full queue (or held frames beyond it) ends the watch with one
    ``watch_overloaded``; the client watches again from its last cursor."""

    def __init__(self, role: PersistentRole, session_id: str) -> None:
        self.role = role
        self.session_id = session_id
        self.live: set[str] = set()
        self._held: list[dict[str, Any]] | None = []
        self._held_bytes = 0
        self._cut = False

    def turn(self, event: TurnEvent) -> None:
        self._put(v2.watch_message(event.info.session_id, event.envelope))

    def session(self, event: dict[str, Any]) -> None:
        self._put(v2.watch_event(event))

    def release(self) -> None:
        held, self._held = self._held or [], None
        for frame in held:
            self._put(frame)

    def _put(self, frame: dict[str, Any]) -> None:
        if self._cut:
            return
        peer = self.role.peer
        limit = peer.server.outbound_limit
        if self._held is not None:
            self._held_bytes += len(msgpack.packb(frame, use_bin_type=True))
            if self._held_bytes > limit:
                self._overloaded()
                return
            self._held.append(frame)
        elif peer.transport.get_write_buffer_size() >= limit:
            self._overloaded()
        else:
            peer.send(frame)

    def _overloaded(self) -> None:
        self._cut = True
        self._held = None
        self.role.core.watchers.remove(self.session_id, self.role.conn.conn_id)
        self.role.peer.send(v2.watch_overloaded(self.session_id))


def _split(events: list[dict[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Events in order, in parts of at most :data:`ATTACH_PART_BYTES` (at least one part)."""
    parts: list[list[Mapping[str, Any]]] = [[]]
    used = 0
    for event in events:
        size = len(msgpack.packb(event, use_bin_type=True))
        if parts[-1] and used + size > ATTACH_PART_BYTES:
            parts.append([])
            used = 0
        parts[-1].append(event)
        used += size
    return parts
