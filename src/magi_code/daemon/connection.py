"""One accepted daemon connection: frames in and out, the hello, and its role object.

The transport side (``feed``, ``end_input``, ``on_lost``) runs in transport callbacks and
never blocks. Frames are decoded into typed values (``protocol/v2.py``) once the role is
known; a role may settle some of them synchronously (``intercept``: the v1 shim's write
acknowledgements must be settled before a later frame of the same read is queued). The
inbox is bounded by pausing the transport's reading at :data:`INBOX_HIGH` frames.
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
INBOX_HIGH: Final = 64
INBOX_LOW: Final = 16

Inbound = Mapping[str, Any] | v2.ClientFrame | Fatal | Rejected | None


class Transport(Protocol):
    """What a connection needs of its transport (a socket's, or the in-memory one)."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...

    def get_write_buffer_size(self) -> int: ...

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
        self.inbox: asyncio.Queue[Inbound] = asyncio.Queue()
        self.lost = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self._decoder = FrameDecoder()
        self._paused = False
        self._ended = False
        server.peers.add(self)
        self.task: asyncio.Task[None] = asyncio.create_task(self._run())

    # -- transport side (synchronous callbacks) --------------------------------------------

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
            self.send(v2.error(Code.FRAMING_ERROR))
            self.end_input()

    def _route(self, raw: dict[str, Any]) -> None:
        item: Inbound = raw
        if self.role is not None:
            item = self._decode(raw)
            if self.intercept is not None and not isinstance(item, (Fatal, Rejected)):
                assert not isinstance(item, Mapping) and item is not None
                if self.intercept(item):
                    return
        self.inbox.put_nowait(item)
        if self.inbox.qsize() >= INBOX_HIGH and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def _decode(self, raw: Mapping[str, Any]) -> Inbound:
        assert self.role is not None
        try:
            return v2.decode(raw, self.role)
        except (Fatal, Rejected) as exc:
            return exc

    def end_input(self) -> None:
        self.inbox.put_nowait(None)

    def on_lost(self) -> None:
        self.lost.set()
        self.writable.set()
        if self.on_lost_hook is not None:
            self.on_lost_hook()
        self.end_input()

    # -- the role's side -------------------------------------------------------------------

    def send(self, frame: Mapping[str, Any]) -> None:
        """Write one frame (dropped once the connection is gone)."""
        if not self.lost.is_set() and not self.transport.is_closing():
            self.transport.write(encode_frame(frame))

    async def drain(self) -> None:
        await self.writable.wait()

    async def next_item(self) -> Inbound:
        if self._ended:
            return None
        item = await self.inbox.get()
        if self._paused and self.inbox.qsize() <= INBOX_LOW:
            self._paused = False
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()
        if item is None:
            self._ended = True
        elif isinstance(item, Mapping) and self.role is not None:
            item = self._decode(item)  # arrived with the hello, before the role was known
        return item

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

    async def _serve(self) -> None:
        try:
            first = await asyncio.wait_for(self.next_item(), HELLO_TIMEOUT_SECONDS)
        except TimeoutError:
            return
        if not isinstance(first, Mapping):
            return
        server = self.server
        try:
            hello = v2.parse_hello(first)
            if server.core.draining:
                raise Fatal(Code.DRAINING)
            if hello.launch is not None and Path(hello.launch.mc_home).resolve() != server.mc_home:
                raise Fatal(Code.WRONG_HOME)
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
        ctx = LaunchContext(Path(launch.mc_home), Path(launch.project_dir), launch.env)
        conn = self.server.core.open(hello.role, ctx, self.end_input)
        if hello.role == "v1_shim":
            return V1Role(self, conn)
        return PersistentRole(self, conn, hello.delta_interval_ms)
