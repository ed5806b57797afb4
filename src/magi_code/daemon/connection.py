"""One accepted daemon connection: frames in and out, the hello, and its role object.

The transport side (``feed``, ``end_input``, ``on_lost``) runs in transport callbacks and
never blocks. Frames are decoded into typed values (``protocol/v2.py``) once the role is
known; a role may settle some of them synchronously (``intercept``: the v1 shim's write
acknowledgements must be settled before a later frame of the same read is queued).

Memory per connection is bounded both ways (RFC-0002 §2, §6.2):

- **inbound**: reading pauses while the inbox holds :data:`INBOX_HIGH` frames or
  :data:`INBOX_BYTES` bytes of frames, and resumes once the role has worked it down;
  a frame must be completed within :data:`FRAME_DEADLINE_SECONDS` of its first byte and
  the hello must arrive within :data:`HELLO_TIMEOUT_SECONDS` (both shortened by a shorter
  client timeout; ``frame_timeout``, ``handshake_timeout``);
- **outbound**: while the transport's unsent bytes exceed its high-water mark (the
  connection's outbound limit) the role takes no further frame from the inbox, so no
  answer is produced that the client has not made room for. A client that takes none of
  its unsent bytes for the server's ``client_timeout`` is disconnected
  (``client_stalled``). That is timed on the output itself whenever the kernel's socket
  buffer is full (the transport holds unsent bytes), not when the role takes its next
  frame: a client that sent requests, stopped, and left their answers unread below the
  limit is dropped as surely as one that keeps sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from magi_code.protocol import v2
from magi_code.protocol.frames import FrameDecoder, FrameError, encode_frame
from magi_code.protocol.v2 import Code, Fatal, Rejected
from magi_code.storage.launch import LaunchContext

from .control_role import ControlRole
from .persistent_role import PersistentRole
from .v1_role import V1Role

if TYPE_CHECKING:
    from .server import DaemonServer

log = logging.getLogger("magi_code.daemon")

HELLO_TIMEOUT_SECONDS: Final = 10.0
FRAME_DEADLINE_SECONDS: Final = 30.0
INBOX_HIGH: Final = 64
INBOX_LOW: Final = 16
INBOX_BYTES: Final = 1024 * 1024

Inbound = Mapping[str, Any] | v2.ClientFrame | Fatal | Rejected | None


class Transport(Protocol):
    """What a connection needs of its transport (a socket's, or the in-memory one)."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def get_write_buffer_size(self) -> int: ...

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Role(Protocol):
    async def serve(self) -> None: ...


class PeerConnection:
    def __init__(self, server: DaemonServer, transport: Transport) -> None:
        self.server = server
        self.transport = transport
        self.role: v2.Role | None = None
        # A role's synchronous handler for frames that must not wait in the inbox.
        self.intercept: Callable[[v2.ClientFrame], bool] | None = None
        self.on_lost_hook: Callable[[], None] | None = None
        self.inbox: asyncio.Queue[tuple[Inbound, int]] = asyncio.Queue()
        self.lost = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self._decoder = FrameDecoder()
        self._queued_bytes = 0
        self._paused = False
        self._ended = False
        self._input_closed = False
        self._frame_timer: asyncio.TimerHandle | None = None
        self._handed = 0  # bytes given to the transport by ``send``
        self._stall_timer: asyncio.TimerHandle | None = None
        # Past this many unsent bytes the transport pauses writing (``writable`` clears).
        limit = server.outbound_limit
        transport.set_write_buffer_limits(high=limit, low=limit // 4)
        server.peers.add(self)
        self.task: asyncio.Task[None] = asyncio.create_task(self._run())

    # -- transport side (synchronous callbacks) --------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._input_closed:
            return
        before = self._decoder.buffered
        failed = False
        try:
            frames = self._decoder.feed(data)
        except FrameError as exc:
            frames, failed = exc.decoded, True
        if frames:
            # The bytes these frames took, shared out for the inbox's byte bound.
            size = (before + len(data) - self._decoder.buffered) // len(frames)
            for frame in frames:
                self._route(frame, size)
        if failed:
            log.warning("framing error")
            self._fail(Code.FRAMING_ERROR)
            return
        self._time_partial_frame()

    def _time_partial_frame(self) -> None:
        partial = self._decoder.buffered > 0
        if partial and self._frame_timer is None:
            loop = asyncio.get_running_loop()
            self._frame_timer = loop.call_later(
                self.server.frame_deadline, self._fail, Code.FRAME_TIMEOUT
            )
        elif not partial and self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None

    def _fail(self, code: Code) -> None:
        """A fatal condition on the input side: say so, stop reading, end the role."""
        if self._input_closed:
            return
        log.warning("closing a connection code=%s", code.value)
        self._input_closed = True
        self._decoder = FrameDecoder()  # drop a partial frame's bytes now
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None
        self.send(v2.error(code))
        self.end_input()

    def _route(self, raw: dict[str, Any], size: int) -> None:
        item: Inbound = raw
        if self.role is not None:
            item = self._decode(raw)
            if self._intercepted(item):
                return
        self.inbox.put_nowait((item, size))
        self._queued_bytes += size
        full = self.inbox.qsize() >= INBOX_HIGH or self._queued_bytes >= INBOX_BYTES
        if full and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def _decode(self, raw: Mapping[str, Any]) -> Inbound:
        assert self.role is not None
        try:
            return v2.decode(raw, self.role)
        except (Fatal, Rejected) as exc:
            return exc

    def end_input(self) -> None:
        self.inbox.put_nowait((None, 0))

    def on_lost(self) -> None:
        self.lost.set()
        self.writable.set()
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self.on_lost_hook is not None:
            self.on_lost_hook()
        self.end_input()

    # -- the role's side -------------------------------------------------------------------

    def send(self, frame: Mapping[str, Any]) -> None:
        """Write one frame (dropped once the connection is gone)."""
        self.write(encode_frame(frame))

    def write(self, data: bytes) -> None:
        """Write encoded frames (dropped once the connection is gone)."""
        if not self.lost.is_set() and not self.transport.is_closing():
            self.transport.write(data)
            self._handed += len(data)
            if self._stall_timer is None:
                self._time_output()

    def _time_output(self) -> None:
        """Time unsent bytes: the client must take some of them within the client timeout."""
        unsent = self.transport.get_write_buffer_size()
        if unsent:
            self._stall_timer = asyncio.get_running_loop().call_later(
                self.server.client_timeout, self._check_output, self._handed - unsent
            )

    def _check_output(self, taken_before: int) -> None:
        self._stall_timer = None
        if self.lost.is_set() or self.transport.is_closing():
            return
        unsent = self.transport.get_write_buffer_size()
        if unsent and self._handed - unsent == taken_before:
            log.warning("closing a connection code=%s", Code.CLIENT_STALLED.value)
            self._ended = True
            self.transport.abort()  # its unsent bytes go now, not when it reads
            return
        self._time_output()  # it took some: time what is left from now

    async def drain(self) -> None:
        await self.writable.wait()

    async def next_item(self) -> Inbound:
        yielded = False
        while True:
            if self._ended:
                return None
            if not self.writable.is_set():
                # Until the client reads the backlog down, or is dropped for not reading.
                await self.writable.wait()
                continue
            if not yielded and not self.inbox.empty():
                # Other connections get the loop between two frames of this one: a get
                # from a queue that holds frames does not yield, so a client's queued
                # frames would otherwise hold the loop for as long as they all take.
                yielded = True
                await asyncio.sleep(0)
                continue
            item, size = await self.inbox.get()
            self._queued_bytes -= size
            if (
                self._paused
                and self.inbox.qsize() <= INBOX_LOW
                and self._queued_bytes < INBOX_BYTES // 4
            ):
                self._paused = False
                with contextlib.suppress(RuntimeError):
                    self.transport.resume_reading()
            if item is None:
                self._ended = True
            elif isinstance(item, Mapping) and self.role is not None:
                # It arrived with the hello, before the role was known: decode it now, and
                # let the role settle it as it would have on arrival.
                item = self._decode(item)
                if self._intercepted(item):
                    continue
            return item

    def _intercepted(self, item: Inbound) -> bool:
        if self.intercept is None or isinstance(item, (Fatal, Rejected, Mapping)) or item is None:
            return False
        return self.intercept(item)

    async def frames(self) -> AsyncIterator[v2.ClientFrame]:
        """Typed frames until input ends; answers rejected frames, stops at a fatal one."""
        while (item := await self.next_item()) is not None:
            if isinstance(item, Fatal):
                log.info("protocol error code=%s", item.code.value)
                self.send(v2.error(item.code))
                return
            if isinstance(item, Rejected):
                self.send(item.answer)
                continue
            assert not isinstance(item, Mapping)
            yield item

    # -- the connection's task -------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._serve()
        except Exception:  # a bug must not take the daemon down
            log.exception("connection handler failed")
            self.send(v2.error(Code.INTERNAL_ERROR))
        finally:
            self.server.peers.discard(self)
            self.transport.close()
            # The role's methods: kept, they would hold the role, and it this connection,
            # in a cycle that only the cycle collector frees.
            self.on_lost_hook = self.intercept = None

    async def _serve(self) -> None:
        try:
            first = await asyncio.wait_for(self.next_item(), self.server.hello_timeout)
        except TimeoutError:
            log.info("closing a connection code=%s", Code.HANDSHAKE_TIMEOUT.value)
            self.send(v2.error(Code.HANDSHAKE_TIMEOUT))
            return
        if not isinstance(first, Mapping):
            return
        server = self.server
        try:
            hello = v2.parse_hello(first)
            if server.core.draining:
                raise Fatal(Code.DRAINING)
            if hello.role != "control" and server.clients() >= server.max_connections:
                raise Fatal(Code.TOO_MANY_CONNECTIONS)
            refusal = None if hello.launch is None else server.home_refusal(hello.launch.mc_home)
            if refusal is not None:
                raise Fatal(refusal)
            if hello.build_id is not None and server.supersede(hello.build_id):
                raise Fatal(Code.DRAINING)  # stopping for this client's build
        except Fatal as exc:
            log.info("refused hello code=%s", exc.code.value)
            self.send(v2.refused(exc.code))
            return
        log.info("connection role=%s", hello.role)
        self.role = hello.role
        await self._role(hello).serve()

    def _role(self, hello: v2.Hello) -> Role:
        if hello.role == "control":
            return ControlRole(self)
        assert hello.launch is not None
        launch = hello.launch
        ctx = LaunchContext(
            Path(launch.mc_home), Path(launch.project_dir), launch.env, umask=launch.umask
        )
        conn = self.server.core.open(
            hello.role,
            ctx,
            self.end_input,
            hello.client_version,
            client_name=hello.client_name,
            notify=self.send if hello.role == "persistent" else None,
        )
        if hello.role == "v1_shim":
            return V1Role(self, conn)
        return PersistentRole(self, conn, hello)
