"""The stdio shim: ``magi-code --app service`` bridged to the daemon (RFC-0002 §5).

The shim keeps the v1 stdio framing (LF/CRLF, the record bound, ``record_too_large``
detection) and forwards one record at a time. It writes each ``output`` batch to stdout
and acknowledges it after the write; it reads the next record once the batch that
answers the current one (``answers: true``) is written and acknowledged, or when the
daemon says ``next`` (a record answered later, by a worker) — exactly the embedded
adapter's order.
stdin EOF or SIGTERM/SIGINT sends ``eof``: the daemon cancels and drains this
connection's turns and login, the shim writes their terminal events, then exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from magi_code.client import (
    Channel,
    DaemonError,
    DaemonStartError,
    DaemonUnavailable,
    connect_channel,
)
from magi_code.endpoint.paths import UnsafeRuntimeDir
from magi_code.protocol.framing import TOO_LARGE, LineFramer
from magi_code.stdio.adapter import (
    ByteReader,
    ByteWriter,
    diagnostic,
    open_reader,
    open_writer,
    read_or_stop,
)
from magi_code.storage.launch import LaunchContext


async def serve_shim(ctx: LaunchContext) -> int:
    """Run the v1 service on this process's stdio through the daemon; the exit code."""
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        channel = await connect_channel(ctx, "v1_shim", autostart=True, client_name="shim")
    except (DaemonUnavailable, DaemonError, DaemonStartError, UnsafeRuntimeDir) as exc:
        diagnostic(f"cannot reach the daemon: {exc}")
        return 1
    stdout = await open_writer(proto_fd)
    bridge = Bridge(channel, await open_reader(0), stdout)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, bridge.stop.set)
    try:
        return await bridge.run()
    finally:
        await channel.close()
        await stdout.finish()


class Bridge:
    def __init__(self, channel: Channel, reader: ByteReader, writer: ByteWriter) -> None:
        self.channel = channel
        self.reader = reader
        self.writer = writer
        self.stop = asyncio.Event()
        self.may_send = asyncio.Event()
        self.may_send.set()
        self.output_failed = False
        self.exit_code = 1
        # Held from a batch's stdout write to its acknowledgement: the daemon must see a
        # batch acknowledged before any record the frontend sent after reading it.
        self.io = asyncio.Lock()

    async def run(self) -> int:
        inbound = asyncio.create_task(self._inbound())
        pump = asyncio.create_task(self._pump(inbound))
        await inbound
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await pump
        return self.exit_code

    async def _inbound(self) -> None:
        """Daemon → stdout, acknowledging each batch after its write attempt."""
        try:
            while (frame := await self.channel.recv()) is not None:
                kind = frame.get("t")
                if kind == "output" and isinstance(frame.get("data"), bytes):
                    await self._write(frame)
                    if frame.get("answers") is True:
                        self.may_send.set()
                elif kind == "next":
                    self.may_send.set()
                elif kind == "end":
                    if frame.get("status") == "output_error" and frame.get("detail"):
                        diagnostic(f"output error: {frame['detail']}; stopping")
                    ok = frame.get("status") == "ok" and not self.output_failed
                    self.exit_code = 0 if ok else 1
                    return
                else:
                    break
        except (DaemonError, ConnectionError, OSError):
            pass
        diagnostic("lost the connection to the daemon; stopping")

    async def _write(self, frame: dict[str, object]) -> None:
        async with self.io:
            await self._write_and_ack(frame)

    async def _write_and_ack(self, frame: dict[str, object]) -> None:
        data = frame["data"]
        assert isinstance(data, bytes)
        if not self.output_failed:
            try:
                await self.writer.write(data)
            except (OSError, ConnectionError, RuntimeError):
                diagnostic("output error: stdout closed; stopping")
                self.output_failed = True
        if self.output_failed:
            await self.channel.send({"t": "output_failed"})
        else:
            await self.channel.send({"t": "written", "seq": frame.get("seq")})

    async def _pump(self, inbound: asyncio.Task[None]) -> None:
        """stdin → daemon, one record at a time; ``eof`` when input (or output) ends."""
        framer = LineFramer()
        while not self.stop.is_set():
            if not await self._turn(inbound):
                break
            chunk = await read_or_stop(self.reader, self.stop)
            frames = framer.feed(chunk) if chunk else framer.eof()
            for frame in frames:
                if not await self._turn(inbound):
                    break
                self.may_send.clear()
                async with self.io:
                    if frame is TOO_LARGE:
                        await self.channel.send({"t": "oversize"})
                    else:
                        assert isinstance(frame, bytes)
                        await self.channel.send({"t": "record", "data": frame})
            if not chunk:
                await self._turn(inbound)
                break
        if not inbound.done():
            await self.channel.send({"t": "eof"})

    async def _turn(self, inbound: asyncio.Task[None]) -> bool:
        """Wait until the daemon allows the next record; False once the bridge ends."""
        waiter = asyncio.ensure_future(self.may_send.wait())
        try:
            await asyncio.wait({waiter, inbound}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return not inbound.done() and not self.output_failed
