"""An in-memory transport: a connection to a :class:`DaemonServer` without a socket.

The daemon side is the same :class:`~.server.SocketProtocol` and role objects a Unix
socket gets (framing included); only the kernel is missing. The client side offers the
stream methods :class:`magi_code.client.Channel` uses (``read``, ``write``, ``drain``,
``close``, ``wait_closed``). Flow control is modelled: the bytes the client has not read
yet are the daemon transport's write buffer, so a client that stops reading meets the
same overload cut as over a socket. The caller is in-process, so there is no peer UID to
check. Used by tests (the contract scenarios run through it) and for embedding.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from .server import DaemonServer, SocketProtocol

HIGH_WATER: Final = 64 * 1024
LOW_WATER: Final = 16 * 1024


class MemoryReader:
    """The client's inbound bytes."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False
        self._ready = asyncio.Event()
        self.on_read: Any = None

    def feed(self, data: bytes) -> None:
        self.buffer += data
        self._ready.set()

    def feed_eof(self) -> None:
        self.eof = True
        self._ready.set()

    async def read(self, n: int) -> bytes:
        while not self.buffer and not self.eof:
            self._ready.clear()
            await self._ready.wait()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        if self.on_read is not None:
            self.on_read()
        return data


class MemoryTransport:
    """The daemon side of the connection (what ``PeerConnection`` writes to)."""

    def __init__(self, reader: MemoryReader) -> None:
        self._reader = reader
        self._loop = asyncio.get_running_loop()
        self.protocol: SocketProtocol | None = None
        self._closing = False
        self._writing_paused = False
        self._reading_paused = False
        self._held: list[bytes] = []
        self._high, self._low = HIGH_WATER, LOW_WATER
        reader.on_read = self._client_read

    # asyncio.Transport's subset the daemon uses
    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._reader.feed(data)
        if not self._writing_paused and len(self._reader.buffer) > self._high:
            self._writing_paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._reader.feed_eof()
        self._loop.call_soon(self._lost)

    def _lost(self) -> None:
        # As asyncio's transports do, let go of the protocol once it is told (and of the
        # client's reader): the connection is freed then, not left in a cycle.
        protocol, self.protocol = self.protocol, None
        self._reader.on_read = None
        if protocol is not None:
            protocol.connection_lost(None)

    abort = close

    def get_write_buffer_size(self) -> int:
        return len(self._reader.buffer)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = HIGH_WATER if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        self._reading_paused = False
        held, self._held = self._held, []
        for data in held:
            self.deliver(data)

    # the client's side
    def deliver(self, data: bytes) -> None:
        if self._closing or self.protocol is None:
            return
        if self._reading_paused:
            self._held.append(data)
        else:
            self.protocol.data_received(data)

    def client_closed(self) -> None:
        if self._closing or self.protocol is None:
            return
        self.protocol.eof_received()
        self.close()

    def _client_read(self) -> None:
        if self._writing_paused and len(self._reader.buffer) <= self._low:
            self._writing_paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()


class MemoryWriter:
    """The client's outbound side."""

    def __init__(self, transport: MemoryTransport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise ConnectionResetError("the daemon closed the connection")
        # Delivered on a later loop step, as a socket would.
        self._loop.call_soon(self._transport.deliver, bytes(data))

    async def drain(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        self._loop.call_soon(self._transport.client_closed)

    async def wait_closed(self) -> None:
        await asyncio.sleep(0)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def connect(server: DaemonServer) -> tuple[MemoryReader, MemoryWriter]:
    """Open a connection to ``server``; returns the client's reader and writer."""
    reader = MemoryReader()
    transport = MemoryTransport(reader)
    protocol = SocketProtocol(server, check_uid=False)
    transport.protocol = protocol
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return reader, MemoryWriter(transport)
