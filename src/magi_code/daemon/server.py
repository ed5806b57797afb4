"""The daemon's socket server: accept peer-checked connections, run one role object each.

Theory of operation:

- ``connection_made`` checks the peer UID before any byte is read and aborts foreign
  peers, and refuses the daemon's own tool processes (``tool_process``, by the peer's
  process ancestry); each accepted connection becomes a :class:`~.connection.PeerConnection`, whose
  ``hello`` picks its role object (``v1_role``, ``persistent_role``, ``control_role``).
- What outlives connections (registrations, detached turns, grants, the turn journal,
  idle accounting, owner drop) is the transport-neutral
  :class:`~magi_code.core.persistent.PersistentCoordinator`.
- Idle stop is decided and enacted in one event-loop step (no await between the check
  and closing the listener), so a client either was counted or meets a closed socket.
- The socket path is checked every :data:`ENDPOINT_CHECK_SECONDS` (two ``stat`` calls): a
  deleted or replaced socket file is re-bound at once under the lifetime lock, leaving
  running turns and open connections alone; a path some other live process now listens on
  is never unlinked (the daemon stops accepting, serves its open connections, and re-binds
  when the path is free again); a replaced lifetime-lock file stops the daemon.
- Where the daemon is its descendants' subreaper (``reaper.py``), every tick collects the
  orphans it adopted (one ``waitid`` when there are none; a worker thread otherwise).
- Once quiet after a connection or turn ended, the heap the C allocator keeps free is
  given back to the system (``heap.py``).
- Owner drop (``stop``, SIGTERM, idle) stops accepting, drains the coordinator (every
  turn cancelled, every connection's work drained and its terminal output sent), and only
  then returns to the caller, which removes the socket and releases the lifetime lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal, Protocol, cast

from magi_code.core.coordinator import ServiceCoordinator
from magi_code.core.persistent import PersistentCoordinator
from magi_code.endpoint.ancestry import is_tool_process
from magi_code.endpoint.paths import UnsafeRuntimeDir
from magi_code.endpoint.peer import check_peer, peer_pid
from magi_code.protocol.frames import MAX_FRAME_BYTES, encode_frame
from magi_code.protocol.limits import ADVERTISED_LIMITS
from magi_code.protocol.v2 import ROLES, SUPPORTED_VERSIONS, Code, refused, welcome
from magi_code.tools.sandbox import probed

from .connection import FRAME_DEADLINE_SECONDS, HELLO_TIMEOUT_SECONDS, PeerConnection, Transport
from .health import process_figures
from .heap import HeapTrimmer
from .outbound import CLIENT_TIMEOUT_SECONDS, DEFAULT_LIMIT_BYTES
from .reaper import OrphanReaper
from .waits import bounded

log = logging.getLogger("magi_code.daemon")

STOP_GRACE_SECONDS: Final = 90.0
# v1-shim and persistent connections at once; control connections get a few more slots.
MAX_CONNECTIONS: Final = 256
CONTROL_SLOTS: Final = 16
ENDPOINT_CHECK_SECONDS: Final = 1.0
REFUSAL_LINGER_SECONDS: Final = 2.0
CAPABILITIES: Final = (
    "v1_bridge",
    "control.status",
    "control.stop",
    "control.take",
    "turn.detach",
    "turn.snapshot",
    "turn.snapshot.page",
    "turn.attach",
    "turn.attach.durable",
    "turn.overload",
    "delta.coalesce",
    "request.deadline",
    "request.idempotency",
    "approvals",
    "grants",
    "tool_details",
    "editor_files",
    "session.watch",
    "control.handover",
    "turn.steer",
    "session.library",
    "session.queue",
    "session.mcp_servers",
    "session.transcript",
    "session.selection",
    "session.fork",
    "session.rewind",
)


EndpointState = Literal["ok", "lock_lost", "socket_lost", "occupied"]


class Endpoint(Protocol):
    """The daemon's socket path, seen by its lifetime-lock holder (``lifecycle.SocketKeeper``).

    ``check`` is cheap (``stat`` calls): ``ok``; ``lock_lost`` (the lock file is no longer
    ours: stop); ``socket_lost`` (the socket file is gone or replaced: re-bind);
    ``occupied`` (another live process listens there; already tried, nothing to do).
    ``rebind`` returns a new listening socket at the same path; it raises ``OSError`` or
    :class:`UnsafeRuntimeDir` (``SocketInUse``) and never unlinks a live socket.
    """

    def check(self) -> EndpointState: ...

    def rebind(self) -> Any: ...


class DaemonServer:
    def __init__(
        self,
        coordinator: ServiceCoordinator,
        *,
        mc_home: Path,
        socket_path: Path,
        version: str,
        build_id: str,
        idle_seconds: float | None,
        mode: str,
        endpoint: Endpoint | None = None,
        outbound_limit: int = DEFAULT_LIMIT_BYTES,
        client_timeout: float = CLIENT_TIMEOUT_SECONDS,
        heap: HeapTrimmer | None = None,
        reaper: OrphanReaper | None = None,
    ) -> None:
        self.core = PersistentCoordinator(coordinator)
        if self.core.queue is not None:
            # No queued turn starts while the daemon stops or waits to restart.
            self.core.queue.hold = lambda: self.core.draining or self.restart_deadline is not None
        self._heap = heap
        # Set where the daemon is its descendants' subreaper: collects adopted orphans.
        self._reaper = reaper
        self.client_timeout = client_timeout
        # A short client timeout (tests, tight deployments) shortens the frame and hello
        # deadlines too.
        self.frame_deadline = min(FRAME_DEADLINE_SECONDS, client_timeout)
        self.hello_timeout = min(HELLO_TIMEOUT_SECONDS, client_timeout)
        self.max_connections = MAX_CONNECTIONS
        self.mc_home = mc_home.resolve()
        self.socket_path = socket_path
        self.version = version
        self.build_id = build_id
        # Set by a client of another build while this daemon is busy: stop once idle.
        self.upgrade_pending = False
        # ``daemon restart`` while turns run: stop when they end, or at this deadline.
        self.restart_deadline: float | None = None
        self.stop_reason: str | None = None
        self.idle_seconds = idle_seconds
        self.mode = mode
        self.outbound_limit = outbound_limit
        self.instance_id = secrets.token_hex(8)
        self.started_at = int(time.time())
        self._started = time.monotonic()
        self.peers: set[PeerConnection] = set()
        self._endpoint = endpoint
        self.accepting = True
        self._stop = asyncio.Event()
        self._listener: asyncio.AbstractServer | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self, sock: Any, ready: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_unix_server(lambda: SocketProtocol(self), sock=sock)
        log.info("listening instance=%s mode=%s", self.instance_id, self.mode)
        ready()
        await self.run_until_stopped()

    async def run_until_stopped(self) -> None:
        """Watch for idleness and a replaced socket until a stop; then the owner drop."""
        watcher = asyncio.create_task(self._watch())
        try:
            await self._stop.wait()
        finally:
            watcher.cancel()
            await self._owner_drop()

    def request_stop(self, reason: str) -> None:
        """Stop accepting now (same step as the decision) and start the owner drop."""
        if not self.core.draining:
            log.info("stopping reason=%s", reason)
            self.stop_reason = reason
        self.core.draining = True
        if self._listener is not None:
            self._listener.close()
        self._stop.set()

    async def _watch(self) -> None:
        tick = 0.25 if self.idle_seconds is None else max(0.05, min(1.0, self.idle_seconds / 4))
        loop = asyncio.get_running_loop()
        last_check = loop.time()
        while not self._stop.is_set():
            await asyncio.sleep(tick)
            now = loop.time()
            if self._endpoint is not None and now - last_check >= ENDPOINT_CHECK_SECONDS:
                last_check = now
                await self._check_endpoint(self._endpoint)
                if self._stop.is_set():
                    return
            # Each decision and its request_stop happen in one step (no await between).
            if self.upgrade_pending and not self.core.busy():
                self.request_stop("upgrade")
                return
            if self.restart_deadline is not None and (
                not self.core.counts()["active_turns"] or now >= self.restart_deadline
            ):
                self.request_stop("restart")
                return
            idle = self.core.idle_for()
            if self.idle_seconds is not None and idle >= self.idle_seconds:
                self.request_stop("idle")
                return
            if self._heap is not None:  # after the decisions: this may await a thread
                await self._heap.tick(len(self.peers), self.core.counts()["active_turns"])
            if self._reaper is not None and self._reaper.due():  # a thread: reads /proc
                await asyncio.to_thread(self._reaper.sweep)

    async def _check_endpoint(self, endpoint: Endpoint) -> None:
        try:
            state = endpoint.check()
        except OSError as exc:
            log.warning("socket check failed (%s)", type(exc).__name__)
            return
        if state == "lock_lost":
            self.request_stop("lock_replaced")
        elif state == "socket_lost":
            await self._rebind(endpoint)

    async def _rebind(self, endpoint: Endpoint) -> None:
        """A new listener at the same path; connections and turns are not touched."""
        try:
            sock = endpoint.rebind()
        except (OSError, UnsafeRuntimeDir) as exc:
            if self.accepting:
                log.warning(
                    "socket lost and not re-bound (%s); serving open connections only",
                    type(exc).__name__,
                )
            self.accepting = False
            if self._listener is not None:
                self._listener.close()  # nobody can reach it through the path any more
            return
        loop = asyncio.get_running_loop()
        try:
            listener = await loop.create_unix_server(lambda: SocketProtocol(self), sock=sock)
        except OSError as exc:
            sock.close()
            log.warning("socket re-bind failed (%s)", type(exc).__name__)
            return
        if self._stop.is_set():  # stopped meanwhile: the owner drop must not see it open
            listener.close()
            return
        previous, self._listener = self._listener, listener
        if previous is not None:
            previous.close()
        self.accepting = True
        log.info("socket re-bound")

    async def _owner_drop(self) -> None:
        self.core.draining = True
        if self._listener is not None:
            self._listener.close()
        await self.core.drain(STOP_GRACE_SECONDS)
        # Roles send their last frames (a shim's ``end``) after their work drained.
        tasks = [peer.task for peer in self.peers if peer.role != "control"]
        if tasks:
            await bounded(asyncio.wait(tasks), 10.0)
        for peer in list(self.peers):
            peer.transport.close()
        log.info("drained")

    def supersede(self, build: str) -> bool:
        """A client of build ``build`` said hello; True when this daemon stops for it.

        Idle (no clients, no turns): stop now, and the client starts its own build.
        Busy: serve it, and stop as soon as idle (``upgrade_pending``).
        """
        if build == self.build_id or self.core.draining:
            return False
        if not self.core.busy():
            self.request_stop("upgrade")
            return True
        if not self.upgrade_pending:
            log.info("upgrade pending: a client of another build connected")
        self.upgrade_pending = True
        return False

    def request_restart(self, wait: float) -> None:
        """Stop once no turn runs (at the latest after ``wait`` s) to be started again."""
        deadline = asyncio.get_running_loop().time() + wait
        if self.restart_deadline is None or deadline < self.restart_deadline:
            self.restart_deadline = deadline

    def clients(self) -> int:
        """Open connections that said hello as a v1 shim or persistent client."""
        return sum(1 for peer in self.peers if peer.role not in (None, "control"))

    # -- frames shared by roles ----------------------------------------------------------

    def welcome(self, role: str) -> dict[str, Any]:
        return welcome(
            self.version,
            self.build_id,
            self.instance_id,
            os.getpid(),
            role,
            {"max_frame_bytes": MAX_FRAME_BYTES, **ADVERTISED_LIMITS},
            CAPABILITIES,
        )

    def status(self) -> dict[str, Any]:
        return {
            "running": True,
            "pid": os.getpid(),
            "version": self.version,
            "build_id": self.build_id,
            "upgrade_pending": self.upgrade_pending,
            "restart_pending": self.restart_deadline is not None,
            "instance_id": self.instance_id,
            "protocol_versions": list(SUPPORTED_VERSIONS),
            "socket": str(self.socket_path),
            "mc_home": str(self.mc_home),
            "accepting": self.accepting,
            "started_at": self.started_at,
            "uptime_seconds": int(time.monotonic() - self._started),
            **self.core.counts(),
            **self.core.holdings(),
            "idle_stop_seconds": self.idle_seconds,
            "mode": self.mode,
            **process_figures(),
            "connections": self._connections_by_role(),
            "max_outbound_queued_bytes": max(
                (peer.transport.get_write_buffer_size() for peer in self.peers), default=0
            ),
            "sandbox": _sandbox_status(),
        }

    def _connections_by_role(self) -> dict[str, int]:
        """Open connections by role; ``handshake``: no hello yet."""
        counts = dict.fromkeys((*ROLES, "handshake"), 0)
        for peer in self.peers:
            counts[peer.role or "handshake"] += 1
        return counts

    def home_refusal(self, home: str) -> Code | None:
        """How to answer a hello (any role) naming ``home`` as its ``MC_HOME``.

        None when it resolves to this daemon's home, ``wrong_home`` when it resolves
        elsewhere, ``invalid_hello`` when it cannot be resolved at all (a symlink loop):
        an odd path is the client's error, never an ``internal_error``.
        """
        try:
            resolved = Path(home).resolve()
        except (OSError, RuntimeError, ValueError):
            return Code.INVALID_HELLO
        return None if resolved == self.mc_home else Code.WRONG_HOME


class SocketProtocol(asyncio.Protocol):
    """The asyncio side of one connection (a Unix socket's, or the in-memory one's)."""

    def __init__(self, server: DaemonServer, *, check_uid: bool = True) -> None:
        self.server = server
        self.check_uid = check_uid
        self.peer: PeerConnection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.check_uid:
            sock = transport.get_extra_info("socket")
            if sock is None or not check_peer(sock):
                log.warning("refused a connection from another user")
                cast(asyncio.Transport, transport).abort()
                return
            # The tool barrier: a process the daemon started (a shell command, an MCP
            # server) is refused before a byte is read (endpoint/ancestry.py).
            pid = peer_pid(sock)
            if is_tool_process(pid, os.getpid()):
                log.warning("refused a connection code=%s pid=%s", Code.TOOL_PROCESS.value, pid)
                _refuse(cast(asyncio.Transport, transport), Code.TOOL_PROCESS)
                return
        # uvloop's transports implement asyncio.Transport without subclassing it.
        connection = cast(Transport, transport)
        server = self.server
        if len(server.peers) >= server.max_connections + CONTROL_SLOTS:
            # Refused before reading a byte: nothing of this connection is kept.
            log.warning("refused a connection code=%s", Code.TOO_MANY_CONNECTIONS.value)
            _refuse(cast(asyncio.Transport, transport), Code.TOO_MANY_CONNECTIONS)
            return
        self.peer = PeerConnection(server, connection)

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


def _sandbox_status() -> dict[str, Any]:
    """Whether this daemon can run a ``workspace_write`` turn's commands in the sandbox
    (probed once, right after start; ``null`` until then), and why not."""
    found = probed()
    return {
        "workspace_write": None if found is None else found.path is not None,
        "problem": None if found is None else found.problem,
    }


def _refuse(transport: asyncio.Transport, code: Code) -> None:
    """Answer ``refused`` before reading a byte, then half-close and linger.

    Its bytes are discarded (the protocol's ``peer`` stays None). Closing at once would
    fail the client's hello write before it reads the refusal; the transport closes when
    the client closes, or after :data:`REFUSAL_LINGER_SECONDS`.
    """
    transport.write(encode_frame(refused(code)))
    transport.write_eof()
    asyncio.get_running_loop().call_later(REFUSAL_LINGER_SECONDS, transport.close)
