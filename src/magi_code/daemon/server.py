"""The daemon's socket server: peer-checked connections speaking RFC-0002 roles.

Theory of operation:

- ``connection_made`` checks the peer UID before any byte is read and aborts foreign
  peers. Frames are decoded as they arrive; a framing error is fatal for the connection.
- Each connection's first frame is ``hello``; its role decides the rest. A ``v1_shim``
  is one v1 stdio service on the shared coordinator (connection-scoped), a
  ``persistent`` client's turns survive it, a ``control`` connection only asks for
  ``status`` or ``stop`` and never keeps the daemon alive.
- A persistent connection never makes a turn wait: its outbound side (``outbound.py``)
  bounds, coalesces and, on overload, cuts live turn streams with an explicit notice.
  ``take_control`` moves a lost persistent client's session (and the authority over
  its running turn) to the caller; expired request deadlines are answered unrun.
- Idle stop is decided and enacted in one event-loop step (no await between the check
  and closing the listener), so a client either was counted or meets a closed socket.
- Owner drop (``stop``, SIGTERM, idle) cancels every turn and login, lets each
  connection drain its terminal output, and only then returns to the caller, which
  removes the socket and releases the lifetime lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, cast

import orjson

from magi_code.core.coordinator import Connection, ServiceCoordinator
from magi_code.core.journal import TurnJournal
from magi_code.core.output import Batch
from magi_code.core.sessions import SessionService
from magi_code.core.turns import TurnService
from magi_code.endpoint.peer import check_peer
from magi_code.protocol.envelope import OutboundError, encode_batch
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.frames import MAX_FRAME_BYTES, FrameDecoder, FrameError, encode_frame
from magi_code.protocol.limits import ADVERTISED_LIMITS, MAX_RECORD_BYTES
from magi_code.protocol.v2 import (
    PROTOCOL_VERSION,
    ROLES,
    SUPPORTED_VERSIONS,
    Code,
    Fatal,
    error,
    parse_hello,
    refused,
    request_error,
)
from magi_code.sessions.ids import validate_session_id
from magi_code.storage.launch import LaunchContext

from .outbound import DEFAULT_LIMIT_BYTES, Outbound

log = logging.getLogger("magi_code.daemon")

HELLO_TIMEOUT_SECONDS: Final = 10.0
STOP_GRACE_SECONDS: Final = 90.0
INBOX_HIGH: Final = 64
INBOX_LOW: Final = 16
SELF_CHECK_SECONDS: Final = 30.0
CAPABILITIES: Final = (
    "v1_bridge",
    "control.status",
    "control.stop",
    "control.take",
    "turn.detach",
    "turn.snapshot",
    "turn.attach",
    "turn.overload",
    "delta.coalesce",
    "request.deadline",
)


class DaemonServer:
    def __init__(
        self,
        coordinator: ServiceCoordinator,
        *,
        mc_home: Path,
        socket_path: Path,
        version: str,
        idle_seconds: float | None,
        mode: str,
        self_check: Callable[[], bool] = lambda: True,
        outbound_limit: int = DEFAULT_LIMIT_BYTES,
    ) -> None:
        self.coordinator = coordinator
        self.mc_home = mc_home.resolve()
        self.socket_path = socket_path
        self.version = version
        self.idle_seconds = idle_seconds
        self.mode = mode
        self.outbound_limit = outbound_limit
        self.instance_id = secrets.token_hex(8)
        self.started_at = int(time.time())
        self.journal = TurnJournal()
        self.peers: set[Peer] = set()
        self.detached: set[int] = set()
        self.draining = False
        self._self_check = self_check
        self._stop = asyncio.Event()
        self._listener: asyncio.AbstractServer | None = None
        turns = [s for s in coordinator.services if isinstance(s, TurnService)]
        self.turns: TurnService | None = turns[0] if turns else None
        sessions = [s for s in coordinator.services if isinstance(s, SessionService)]
        self.sessions: SessionService | None = sessions[0] if sessions else None

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self, sock: Any, ready: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_unix_server(lambda: _Protocol(self), sock=sock)
        log.info("listening instance=%s mode=%s", self.instance_id, self.mode)
        ready()
        watcher = asyncio.create_task(self._watch())
        try:
            await self._stop.wait()
        finally:
            watcher.cancel()
            await self._owner_drop()

    def request_stop(self, reason: str) -> None:
        """Stop accepting now (same step as the decision) and start the owner drop."""
        if not self.draining:
            log.info("stopping reason=%s", reason)
        self.draining = True
        if self._listener is not None:
            self._listener.close()
        self._stop.set()

    def busy(self) -> bool:
        return bool(
            self.coordinator.connections
            or any(peer.role != "control" for peer in self.peers)
            or (self.turns is not None and self.turns.active)
        )

    async def _watch(self) -> None:
        tick = 0.25 if self.idle_seconds is None else max(0.05, min(1.0, self.idle_seconds / 4))
        loop = asyncio.get_running_loop()
        last_busy = loop.time()
        last_check = loop.time()
        while not self._stop.is_set():
            await asyncio.sleep(tick)
            now = loop.time()
            if now - last_check >= SELF_CHECK_SECONDS:
                last_check = now
                if not self._self_check():
                    self.request_stop("socket_or_lock_replaced")
                    return
            if self.busy():
                last_busy = now
            elif self.idle_seconds is not None and now - last_busy >= self.idle_seconds:
                self.request_stop("idle")  # no await between the check and the close
                return

    async def _owner_drop(self) -> None:
        self.draining = True
        if self._listener is not None:
            self._listener.close()
        if self.turns is not None:
            for run in list(self.turns.active.values()):
                run.cancel()
        for peer in list(self.peers):
            if peer.role != "control":  # control callers see EOF only once all is drained
                peer.end_input()
        workers = [p.task for p in self.peers if p.task is not None and p.role != "control"]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=STOP_GRACE_SECONDS)
            for task in pending:
                task.cancel()
        for peer in list(self.peers):
            peer.transport.close()
        log.info("drained")

    # -- frames shared by roles ----------------------------------------------------------

    def welcome(self, role: str) -> dict[str, Any]:
        return {
            "t": "welcome",
            "protocol_version": PROTOCOL_VERSION,
            "server_name": "magi-code",
            "server_version": self.version,
            "instance_id": self.instance_id,
            "pid": os.getpid(),
            "role": role,
            "lifetime": ROLES[role],
            "limits": {"max_frame_bytes": MAX_FRAME_BYTES, **ADVERTISED_LIMITS},
            "capabilities": list(CAPABILITIES),
        }

    def status(self) -> dict[str, Any]:
        turns = self.turns.active if self.turns is not None else {}
        return {
            "running": True,
            "pid": os.getpid(),
            "version": self.version,
            "instance_id": self.instance_id,
            "protocol_versions": list(SUPPORTED_VERSIONS),
            "socket": str(self.socket_path),
            "started_at": self.started_at,
            "clients": len(self.coordinator.connections) - len(self.detached),
            "active_turns": len(turns),
            # Detached: its session's controller is a lost persistent client.
            "detached_turns": sum(1 for r in turns.values() if r.attachment.owner in self.detached),
            "idle_stop_seconds": self.idle_seconds,
            "mode": self.mode,
        }


class _Protocol(asyncio.Protocol):
    def __init__(self, server: DaemonServer) -> None:
        self.server = server
        self.peer: Peer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is None or not check_peer(sock):
            log.warning("refused a connection from another user")
            transport.abort()
            return
        self.peer = Peer(self.server, transport)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.feed(data)

    def eof_received(self) -> bool | None:
        if self.peer is not None:
            self.peer.end_input()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.on_lost()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.writable.clear()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.writable.set()


class Peer:
    """One accepted connection and the task serving its role."""

    def __init__(self, server: DaemonServer, transport: asyncio.Transport) -> None:
        self.server = server
        self.transport = transport
        self.role: str | None = None
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.lost = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self._decoder = FrameDecoder()
        self._paused = False
        self._ended = False
        self._pending: Batch | None = None  # v1 output sent, not yet acknowledged
        self._answer: Batch | None = None  # the batch answering the current v1 record
        self._acked = asyncio.Event()
        self._ack_ok = False
        self._ack_seq = 0
        self.outbound: Outbound | None = None
        server.peers.add(self)
        self.task: asyncio.Task[None] | None = asyncio.create_task(self._run())

    # -- transport side (synchronous callbacks) ------------------------------------------

    def feed(self, data: bytes) -> None:
        failed = False
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            frames, failed = exc.decoded, True
        for frame in frames:
            self._route(frame)
        if failed:
            log.warning("framing error")
            self.send(error(Code.FRAMING_ERROR))
            self.end_input()

    def _route(self, frame: dict[str, Any]) -> None:
        kind = frame.get("t")
        if self.role == "v1_shim" and kind in ("written", "output_failed"):
            self._settle(kind == "written" and frame.get("seq") == self._ack_seq)
            return
        self.inbox.put_nowait(frame)
        if self.inbox.qsize() >= INBOX_HIGH and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def _settle(self, ok: bool) -> None:
        # Synchronously, before any later frame of the same read is queued: whatever waits
        # on the batch (a worker's busy flag, a reservation) is settled before the shim's
        # next record is handled, as in embedded mode.
        batch, self._pending = self._pending, None
        if batch is None:
            return
        self._ack_ok = ok
        batch.written()
        self._acked.set()

    def end_input(self) -> None:
        self.inbox.put_nowait(None)

    def on_lost(self) -> None:
        self.lost.set()
        self.writable.set()
        self._settle(False)
        self.end_input()

    def send(self, frame: dict[str, Any]) -> None:
        if not self.lost.is_set() and not self.transport.is_closing():
            self.transport.write(encode_frame(frame))

    async def drain(self) -> None:
        await self.writable.wait()

    async def next_frame(self) -> dict[str, Any] | None:
        if self._ended:
            return None
        frame = await self.inbox.get()
        if self._paused and self.inbox.qsize() <= INBOX_LOW:
            self._paused = False
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()
        if frame is None:
            self._ended = True
        return frame

    # -- the role task -------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._serve()
        except Exception:  # a bug must not take the daemon down
            log.exception("connection handler failed")
            self.send(error(Code.INTERNAL_ERROR))
        finally:
            self.server.peers.discard(self)
            self.transport.close()

    async def _serve(self) -> None:
        try:
            first = await asyncio.wait_for(self.next_frame(), HELLO_TIMEOUT_SECONDS)
        except TimeoutError:
            return
        if first is None:
            return
        try:
            hello = parse_hello(first)
            if self.server.draining:
                raise Fatal(Code.DRAINING)
            if (
                hello.launch is not None
                and Path(hello.launch.mc_home).resolve() != self.server.mc_home
            ):
                raise Fatal(Code.WRONG_HOME)
        except Fatal as exc:
            log.info("refused hello code=%s", exc.code)
            self.send(refused(exc.code))
            return
        self.role = hello.role
        log.info("connection role=%s", hello.role)
        if hello.role == "control":
            self.send(self.server.welcome(hello.role))
            await self._serve_control()
            return
        assert hello.launch is not None
        launch = LaunchContext(
            Path(hello.launch.mc_home), Path(hello.launch.project_dir), hello.launch.env
        )
        transports = ("stdio",) if hello.role == "v1_shim" else ("unix",)
        conn = self.server.coordinator.open_connection(launch, transports)
        self.send(self.server.welcome(hello.role))
        if hello.role == "v1_shim":
            await self._serve_v1(conn)
            return
        self.outbound = Outbound(
            self._write_message,
            self.send,
            self.transport.get_write_buffer_size,
            limit=self.server.outbound_limit,
            interval_ms=hello.delta_interval_ms,
            on_cut=lambda turn_id: self.server.journal.unfollow(turn_id, self._deliver),
        )
        try:
            await self._serve_persistent(conn)
        finally:
            self.outbound.close()

    # -- control -------------------------------------------------------------------------

    async def _serve_control(self) -> None:
        while (frame := await self.next_frame()) is not None:
            if frame.get("t") != "control":
                self.send(error(Code.PROTOCOL_ERROR))
                return
            self._control(frame)

    def _control(self, frame: dict[str, Any]) -> None:
        op, request_id = frame.get("op"), frame.get("id")
        if op == "status":
            self.send({"t": "control_result", "id": request_id, "result": self.server.status()})
        elif op == "stop":
            self.send({"t": "control_result", "id": request_id, "result": {"stopping": True}})
            self.server.request_stop("control")
        else:
            self.send({"t": "control_error", "id": request_id, "code": "unknown_operation"})

    # -- v1 shim -------------------------------------------------------------------------

    async def _serve_v1(self, conn: Connection) -> None:
        coordinator = self.server.coordinator
        writer = asyncio.create_task(self._v1_writer(conn))
        try:
            while (frame := await self.next_frame()) is not None:
                if writer.done() or conn.output.closed:
                    break
                kind, data = frame.get("t"), frame.get("data")
                if kind == "eof":
                    break
                if kind == "record" and isinstance(data, bytes):
                    batch = await coordinator.handle_record(conn, data)
                elif kind == "oversize":
                    batch = coordinator.reject_oversize(conn)
                else:
                    self.send(error(Code.PROTOCOL_ERROR))
                    break
                if batch is not None:
                    # Its output frame says it answers the record: the shim reads the next
                    # record after writing and acknowledging it, with no extra round trip.
                    self._answer = batch
                    await _wait_either(batch.done.wait(), writer)
                    continue
                if writer.done() or conn.output.closed:
                    break
                self.send({"t": "next"})
        finally:
            # EOF, shim death or owner drop: cancel and drain this connection's work; its
            # terminal events still reach the shim while it is connected.
            await coordinator.close_connection(conn)
            status, detail = await writer
        if status != "lost":
            self.send({"t": "end", "status": status, "detail": detail})
            await _bounded(self.drain(), 5.0)

    async def _v1_writer(self, conn: Connection) -> tuple[str, str | None]:
        while (batch := await conn.output.get()) is not None:
            try:
                data = encode_batch(batch.messages)
            except OutboundError as exc:
                log.warning("v1 output error")
                batch.written()
                conn.output.close()
                return "output_error", str(exc)
            if self.lost.is_set():
                batch.written()
                conn.output.close()
                return "lost", None
            self._ack_seq += 1
            self._pending = batch
            self._acked.clear()
            frame = {"t": "output", "seq": self._ack_seq, "data": data}
            if batch is self._answer:
                frame["answers"] = True
                self._answer = None
            self.send(frame)
            await self._acked.wait()  # _settle() called batch.written()
            if not self._ack_ok:
                conn.output.close()
                return ("lost" if self.lost.is_set() else "output_error"), None
        return "ok", None

    # -- persistent ----------------------------------------------------------------------

    async def _serve_persistent(self, conn: Connection) -> None:
        coordinator = self.server.coordinator
        journal = self.server.journal
        writer = asyncio.create_task(self._persistent_writer(conn))
        try:
            while (frame := await self.next_frame()) is not None:
                kind, request_id = frame.get("t"), frame.get("id")
                if kind == "request":
                    if self._expired(frame):
                        continue
                    batch = await self._persistent_request(conn, frame.get("message"))
                    if batch is not None:
                        await _wait_either(batch.done.wait(), writer)
                elif kind == "take_control":
                    await self._take_control(conn, frame)
                elif kind == "control":
                    self._control(frame)
                elif kind == "snapshot":
                    turns = journal.snapshot()
                    self.send({"t": "snapshot_result", "id": request_id, "turns": turns})
                elif kind == "attach":
                    self._attach(frame)
                else:
                    self.send(error(Code.UNKNOWN_FRAME))
                    break
        finally:
            journal.forget(self._deliver)
            detach = not self.server.draining
            if detach:
                self.server.detached.add(conn.conn_id)
            try:
                await coordinator.close_connection(conn, detach=detach)
                await writer
            finally:
                self.server.detached.discard(conn.conn_id)

    def _expired(self, frame: dict[str, Any]) -> bool:
        """Answer a request whose deadline is invalid or passed without running it."""
        deadline = frame.get("deadline_ms")
        if deadline is None:
            return False
        message = frame.get("message")
        request_id = message.get("request_id") if isinstance(message, dict) else None
        if not isinstance(deadline, int) or isinstance(deadline, bool):
            self.send(request_error(request_id, Code.INVALID_DEADLINE))
            return True
        if time.time() * 1000 >= deadline:
            log.info("request expired before it ran")
            self.send(request_error(request_id, Code.DEADLINE_EXCEEDED))
            return True
        return False

    async def _take_control(self, conn: Connection, frame: dict[str, Any]) -> None:
        """A control grant (RFC-0002 §6.1): this connection becomes the session's controller."""
        request_id, session_id = frame.get("id"), frame.get("session_id")
        server = self.server
        try:
            if not conn.initialized:
                raise ServiceError(ErrorCode.NOT_INITIALIZED)
            if server.sessions is None or server.turns is None:
                raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
            session_id = validate_session_id(session_id)
            attachment = await server.sessions.take(conn, session_id, server.detached.__contains__)
        except ServiceError as exc:
            self.send({"t": "grant_error", "id": request_id, "code": exc.code.value})
            return
        turns = [
            {"turn_id": run.turn_id, "sequence": server.journal.sequence(run.turn_id)}
            for run in server.turns.active.values()
            if run.attachment is attachment
        ]
        log.info("control granted")
        self.send(
            {"t": "control_granted", "id": request_id, "session_id": session_id, "turns": turns}
        )

    async def _persistent_request(self, conn: Connection, message: object) -> Any:
        coordinator = self.server.coordinator
        try:
            data = orjson.dumps(message) if isinstance(message, dict) else b""
        except TypeError:
            data = b""  # not JSON-representable: answered like a malformed record
        if len(data) + 1 > MAX_RECORD_BYTES:
            return coordinator.reject_oversize(conn)
        return await coordinator.handle_record(conn, data)

    def _attach(self, frame: dict[str, Any]) -> None:
        request_id, turn_id, after = (
            frame.get("id"),
            frame.get("turn_id"),
            frame.get("after_sequence"),
        )
        if after is None:
            after = -1
        if not isinstance(turn_id, str) or not isinstance(after, int) or isinstance(after, bool):
            self.send({"t": "attach_error", "id": request_id, "code": "invalid_request"})
            return
        answer = self.server.journal.attach(turn_id, after, self._deliver)
        if answer is None:
            self.send({"t": "attach_error", "id": request_id, "code": "unknown_turn"})
            return
        status, events = answer
        assert self.outbound is not None
        if status == "finished":
            self.outbound.cut.pop(turn_id, None)
        else:
            self.outbound.follow(turn_id)
        self.send({"t": "attach_result", "id": request_id, "status": status, "events": events})

    def _deliver(self, message: dict[str, Any]) -> None:
        """A followed turn's event from the journal."""
        if self.outbound is not None:
            self.outbound.deliver(message)

    def _write_message(self, message: dict[str, Any]) -> None:
        try:
            self.send({"t": "message", "message": message})
        except FrameError:
            log.warning("persistent output error")

    async def _persistent_writer(self, conn: Connection) -> None:
        # Runs until the connection's output ends, also after the client is gone: detached
        # turns keep feeding the journal (their replay buffer) through it. It never waits
        # for the client: a slow one is cut from turns' live streams (outbound.py).
        assert self.outbound is not None
        while (batch := await conn.output.get()) is not None:
            for message in batch.messages:
                self.outbound.own(message, self.server.journal.observe)
            batch.written()


async def _wait_either(waiter: Any, task: asyncio.Task[Any]) -> None:
    future = asyncio.ensure_future(waiter)
    try:
        await asyncio.wait({future, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        future.cancel()


async def _bounded(awaitable: Any, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(awaitable, timeout)
