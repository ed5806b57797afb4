"""The daemon's core in this test's event loop, reached through the in-memory transport.

``InMemoryDaemon`` runs the real :class:`DaemonServer` (roles, persistent coordinator,
domains, session files under the test's MC_HOME) without a socket or a process;
``client()`` / ``channel()`` connect to it as the socket clients would. ``V1Service`` is
the v1 stdio service as the shim bridges it (the shim's own bridging logic over in-memory
stdio), with the methods the contract fixture runner uses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, cast

import orjson

from magi_code.client import Channel, Client, DaemonError
from magi_code.composition import build_coordinator
from magi_code.daemon import memory
from magi_code.daemon.server import DaemonServer
from magi_code.protocol.v2 import Role
from magi_code.shim.core import ShimCore
from magi_code.storage.launch import LaunchContext
from magi_code.version import build_id

from .service import STEP_TIMEOUT, service_env


class InMemoryDaemon:
    def __init__(self, server: DaemonServer, ctx: LaunchContext) -> None:
        self.server = server
        self.ctx = ctx
        self._task = asyncio.create_task(server.run_until_stopped())

    @classmethod
    async def start(
        cls, home: Path, project: Path, env: Mapping[str, str] | None = None
    ) -> InMemoryDaemon:
        ctx = LaunchContext(home, project, service_env(home, env))
        coordinator = await build_coordinator(ctx, ("unix",))
        server = DaemonServer(
            coordinator,
            mc_home=home,
            socket_path=home / "in-memory",
            version="test",
            build_id=build_id(),
            idle_seconds=None,
            mode="foreground",
        )
        return cls(server, ctx)

    async def channel(
        self,
        role: Role = "persistent",
        options: Mapping[str, Any] | None = None,
        build: str | None = None,
    ) -> Channel:
        reader, writer = memory.connect(self.server)
        launch = None if role == "control" else self.ctx
        return await Channel.handshake(
            cast(asyncio.StreamReader, reader),
            cast(asyncio.StreamWriter, writer),
            role,
            launch,
            options=options,
            build=build,
        )

    async def client(self, role: Role = "persistent") -> Client:
        return Client(await self.channel(role))

    async def stop(self) -> None:
        self.server.request_stop("test")
        await asyncio.wait_for(self._task, 60)


@contextlib.asynccontextmanager
async def in_memory_daemon(
    home: Path, project: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[InMemoryDaemon]:
    daemon = await InMemoryDaemon.start(home, project, env)
    try:
        yield daemon
    finally:
        await daemon.stop()


class _Stdin:
    def __init__(self) -> None:
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()

    def push(self, data: bytes) -> None:
        self._chunks.put_nowait(data)

    async def read(self) -> bytes:
        return await self._chunks.get()


class _Stdout:
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.buffer += data
        self.changed.set()


class V1Service:
    """A v1 stdio service bridged to the in-memory daemon, as the shim runs it.

    The shim's own bridging logic (:class:`ShimCore`: framing, the window of records in
    flight, acknowledgements after each stdout write, EOF and exit status) driven by two
    tasks over in-memory stdio and the in-memory daemon connection, in place of the
    shim's ``selectors`` loop.
    """

    def __init__(self, daemon: InMemoryDaemon, channel: Channel) -> None:
        self.daemon = daemon
        self.channel = channel
        self.core = ShimCore()
        self.stdin = _Stdin()
        self.stdout = _Stdout()
        self._sending = asyncio.Lock()
        self._changed = asyncio.Event()  # the core may want stdin again
        self._run = asyncio.create_task(self._bridge())
        self._eof = False

    @classmethod
    async def start(cls, daemon: InMemoryDaemon) -> V1Service:
        return cls(daemon, await daemon.channel("v1_shim"))

    # -- the driver ----------------------------------------------------------------------

    async def _bridge(self) -> int:
        inbound = asyncio.create_task(self._inbound())
        pump = asyncio.create_task(self._pump())
        try:
            await inbound
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        assert self.core.exit_code is not None
        return self.core.exit_code

    async def _inbound(self) -> None:
        core = self.core
        while not core.finished:
            try:
                frame = await self.channel.recv()
            except DaemonError:
                frame = None
            if frame is None:
                core.lost()
            else:
                core.feed_frames([frame])
            if core.needs_write:
                self.stdout.write(core.stdout)
                core.wrote(True)
            await self._flush()
            self._changed.set()

    async def _pump(self) -> None:
        core = self.core
        while True:
            while not core.wants_stdin:
                self._changed.clear()
                await self._changed.wait()
            core.feed_stdin(await self.stdin.read())
            await self._flush()

    async def _flush(self) -> None:
        # Frames go out in the order the core queued them, whichever task queued them.
        async with self._sending:
            for frame in self.core.take_frames():
                with contextlib.suppress(ConnectionError, OSError):
                    await self.channel.send(frame)
            self.core.take_diagnostics()

    # -- what the contract runner uses ---------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        self.stdin.push(data)

    async def send(self, record: Mapping[str, Any]) -> None:
        await self.send_raw(orjson.dumps(record) + b"\n")

    async def close_stdin(self) -> None:
        if not self._eof:
            self._eof = True
            self.stdin.push(b"")

    async def recv(self, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while b"\n" not in self.stdout.buffer:
                if self._run.done():
                    raise EOFError("service closed stdout")
                self.stdout.changed.clear()
                waiter = asyncio.ensure_future(self.stdout.changed.wait())
                await asyncio.wait({waiter, self._run}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
        line, _, rest = bytes(self.stdout.buffer).partition(b"\n")
        self.stdout.buffer[:] = rest
        message: dict[str, Any] = orjson.loads(line)
        return message

    async def wait(self, timeout: float = STEP_TIMEOUT) -> int:
        return await asyncio.wait_for(asyncio.shield(self._run), timeout)

    async def stop(self) -> None:
        await self.close_stdin()
        try:
            await asyncio.wait_for(asyncio.shield(self._run), 10)
        finally:
            await self.channel.close()
