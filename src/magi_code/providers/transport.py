"""The HTTP/1.1 transport under the service's direct httpx clients (runtime layer).

Theory of operation: httpx's default transport (httpcore over anyio) costs ~20 µs of CPU
for every chunk a response delivers: a dozen generator layers, and per read a cancel
scope, a timeout, a checkpoint and an event, each asking for the running loop (a
``getpid`` system call on Python 3.11). A provider streams its reply as many small
chunks, one per SSE frame, and a tool-heavy turn reads thousands of them on the loop
that runs the turn. This transport is the same HTTP/1.1 exchange with less in between:

- ``h11`` (the state machine httpcore uses) writes requests and reads response heads;
  :class:`_Unframer` reads bodies (a length, chunks, or up to the connection's end) and
  returns everything received so far as one piece, not one per HTTP chunk. A
  :class:`_Channel` (an asyncio protocol) buffers what the socket delivers and wakes the
  one reader; a read that finds data waiting costs no timer and no future.
- One request at a time per connection (no pipelining), and connections are not
  limited in number: the service's own concurrency (turns, subagents) bounds them.
- Connections are kept per origin while idle (at most ``MAX_IDLE`` in all, each for
  ``KEEPALIVE_SECONDS``), only after a response was read to its end, and only while
  both sides keep the connection open. An idle connection the server closed, or that
  received anything, is dropped before use; one that ends with nothing received when it
  is taken again (the server closed it meanwhile) sends the request once more on a new
  connection. Any other ending (an error, a timeout, a response closed early, a
  cancelled task) closes the connection.
- Timeouts are httpx's, per request: ``connect`` (resolution, TCP and TLS), ``read``
  (each wait for data, i.e. the gap between chunks), ``write`` (each wait for the
  socket to take the request). Failures are httpx's exception classes with fixed
  messages (never a URL or a header), so callers map them as before.
- Connecting tries the resolved addresses IPv6 and IPv4 alternately, starting the next
  one ``HAPPY_EYEBALLS_SECONDS`` after the last unless it already failed (RFC 8305):
  a host with an unreachable address family still connects at once.

Proxied routes keep httpx's own transport (``http.build_client`` mounts it per proxy).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import ssl
import time
from asyncio import FIRST_COMPLETED
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Final, TypeAlias, cast

import h11
import httpx

MAX_IDLE: Final = 20
KEEPALIVE_SECONDS: Final = 5.0
HAPPY_EYEBALLS_SECONDS: Final = 0.25
# Received but not yet read: above this the socket stops being read until the reader
# takes what is buffered (a slow consumer must not buffer a whole response in memory).
HIGH_WATER: Final = 256 * 1024
# A response's status line and headers, as httpcore allows them.
MAX_HEAD_BYTES: Final = 100 * 1024
_DEFAULT_PORTS: Final = {b"http": 80, b"https": 443}

_Origin: TypeAlias = tuple[bytes, bytes, int]
_AddressInfo: TypeAlias = tuple[
    socket.AddressFamily,
    socket.SocketKind,
    int,
    str,
    tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes],
]


class _Channel(asyncio.Protocol):
    """One connection's bytes: received chunks queued for one reader, writes with flow
    control. ``ended`` once the peer closed or the connection was lost."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._reading_paused = False
        self._reader: asyncio.Future[None] | None = None
        self._writer: asyncio.Future[None] | None = None
        self._writing_paused = False
        self.transport: asyncio.Transport | None = None
        self.ended = False
        self.lost: BaseException | None = None
        self.received = False  # anything in the current exchange

    # -- protocol callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not registered as asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake_reader()
        return False  # close the transport: HTTP/1.1 has no use for a half-open socket

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.lost = exc
        self._wake_reader()
        writer = self._writer
        if writer is not None and not writer.done():
            writer.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        writer = self._writer
        if writer is not None and not writer.done():
            writer.set_result(None)

    def _wake_reader(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    # -- used by the transport ------------------------------------------------------

    @property
    def has_data(self) -> bool:
        return bool(self._chunks)

    async def read(self, timeout: float | None) -> bytes:
        """Everything received and not yet read (waiting for something if there is
        nothing), or b"" at the end of the connection.

        Raises:
            httpx.ReadTimeout: nothing arrived within ``timeout`` seconds.
            httpx.ReadError: the connection failed.
        """
        if not self._chunks and not self.ended:
            self._reader = self._loop.create_future()
            try:
                await self._wait(self._reader, timeout)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out waiting for the response") from None
            finally:
                self._reader = None
        if self._chunks:
            chunks = self._chunks
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self._buffered = 0
            if self._reading_paused and self.transport:  # all of it was taken
                self._reading_paused = False
                self.transport.resume_reading()
            return data
        if self.lost is not None:
            raise httpx.ReadError("the connection failed")
        return b""

    async def write(self, parts: list[bytes], timeout: float | None) -> None:
        """Hand ``parts`` to the socket; returns once the buffer is below its high mark.

        Raises:
            httpx.WriteTimeout: the socket took too little within ``timeout`` seconds.
            httpx.WriteError: the connection ended.
        """
        if self.ended or self.transport is None or self.transport.is_closing():
            raise httpx.WriteError("the connection is closed")
        self.transport.writelines(parts)
        while self._writing_paused and not self.ended:
            self._writer = self._loop.create_future()
            try:
                await self._wait(self._writer, timeout)
            except TimeoutError:
                raise httpx.WriteTimeout("timed out sending the request") from None
            finally:
                self._writer = None
        if self.lost is not None:
            raise httpx.WriteError("the connection failed")

    async def _wait(self, waiter: asyncio.Future[None], timeout: float | None) -> None:
        if timeout is None:
            await waiter
            return
        timer = self._loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.ended = True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Connection:
    """A channel and the h11 state of the exchange on it (h11 reads a response's head; its
    body is unframed by :class:`_Unframer`)."""

    def __init__(self, origin: _Origin, channel: _Channel) -> None:
        self.origin = origin
        self.channel = channel
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.idle_since = 0.0

    def reset(self) -> None:
        """Ready for the next exchange, after a response whose body was read to its end."""
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.channel.received = False

    def reusable(self, now: float) -> bool:
        return (
            not self.channel.ended
            and not self.channel.has_data
            and now - self.idle_since < KEEPALIVE_SECONDS
        )

    async def next_event(self, timeout: float | None) -> object:
        http = self.http
        try:
            event = http.next_event()
            while event is h11.NEED_DATA:
                http.receive_data(await self.channel.read(timeout))
                event = http.next_event()
        except h11.RemoteProtocolError:
            raise httpx.RemoteProtocolError("the server broke the HTTP protocol") from None
        if type(event) is h11.ConnectionClosed:
            raise httpx.RemoteProtocolError("the server closed the connection")
        return event


# States of a chunked body.
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
# A chunk's size line in its strict form (anything else takes the general path).
_CHUNK_HEAD: Final = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\r\n]{0,4000})?\r\n")
# A chunk-size line (with extensions) or a trailer line longer than this is refused.
MAX_LINE_BYTES: Final = 4096


class _Unframer:
    """A response body's payload from its bytes (sans I/O): ``feed`` takes what arrived
    (b"" at the connection's end) and returns the payload it completes, all of it in one
    piece: chunk boundaries carry no meaning, and a reply of many small chunks costs one
    pass instead of one per chunk. Framing as RFC 9112 section 6.3: ``chunked``, a
    ``length``, or ``eof`` (the body ends with the connection)."""

    __slots__ = ("_buffer", "_kind", "_remaining", "_state", "_trailer", "done", "extra")

    def __init__(self, kind: str, length: int = 0) -> None:
        self._kind = kind
        self._remaining = length
        self._buffer = b""
        self._state = _SIZE
        self._trailer = 0
        self.done = kind == "length" and length == 0
        self.extra = False  # bytes past the body's end: the connection cannot be reused

    def feed(self, data: bytes) -> bytes:
        """Raises:
        httpx.RemoteProtocolError: a malformed body, or its end before it was whole."""
        if self._kind == "eof":
            self.done = not data
            return data
        if not data:
            if not self.done:
                raise httpx.RemoteProtocolError("the server ended the response early")
            return b""
        if self.done:
            self.extra = True
            return b""
        if self._kind == "length":
            if len(data) < self._remaining:
                self._remaining -= len(data)
                return data
            self.extra = len(data) > self._remaining
            data = data[: self._remaining]
            self._remaining = 0
            self.done = True
            return data
        return self._chunks(self._buffer + data if self._buffer else data)

    def _chunks(self, buffer: bytes) -> bytes:
        out: list[bytes] = []
        state, remaining = self._state, self._remaining  # locals: the loop runs per chunk
        position, end = 0, len(buffer)
        while position < end:
            if state == _DATA:
                taken = min(remaining, end - position)
                out.append(buffer[position : position + taken])
                position += taken
                remaining -= taken
                if not remaining:
                    state = _DATA_END
                continue
            if state == _SIZE:
                # The usual case, a whole chunk at hand: its size line, data and CRLF.
                whole = _CHUNK_HEAD.match(buffer, position)
                if whole is not None:
                    length = int(whole[1], 16)
                    data_end = whole.end() + length
                    if length and buffer.startswith(b"\r\n", data_end):
                        out.append(buffer[whole.end() : data_end])
                        position = data_end + 2
                        continue
            elif state == _DATA_END and buffer.startswith(b"\r\n", position):
                position += 2
                state = _SIZE
                continue
            newline = buffer.find(b"\n", position)
            if newline < 0:
                if end - position > MAX_LINE_BYTES:
                    raise httpx.RemoteProtocolError("the server sent a malformed chunk")
                break
            line = buffer[position:newline].removesuffix(b"\r")
            position = newline + 1
            if state == _SIZE:
                size = line.split(b";", 1)[0].strip()
                if len(line) > MAX_LINE_BYTES or not _HEX.fullmatch(size):
                    raise httpx.RemoteProtocolError("the server sent a malformed chunk")
                remaining = int(size, 16)
                state = _DATA if remaining else _TRAILER
            elif state == _DATA_END:
                if line:
                    raise httpx.RemoteProtocolError("the server sent a malformed chunk")
                state = _SIZE
            else:  # trailer fields, ignored, until the empty line
                self._trailer += len(line) + 2
                if self._trailer > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError("the server sent a malformed chunk")
                if not line:
                    self.done = True
                    break
        self._state, self._remaining = state, remaining
        self._buffer = buffer[position:]
        if self.done and self._buffer:
            self.extra = True
        return out[0] if len(out) == 1 else b"".join(out)


def _unframer(method: bytes, response: h11.Response) -> tuple[_Unframer, bool]:
    """The body's framing, and whether the server keeps the connection after it (h11
    validated the headers this reads when it parsed the head)."""
    keep = response.http_version >= b"1.1"
    chunked = False
    length: int | None = None
    for name, value in response.headers:
        if name == b"transfer-encoding":
            chunked = True
        elif name == b"content-length":
            length = int(value.split(b",", 1)[0])
        elif name == b"connection" and b"close" in value.lower():
            keep = False
    if response.status_code in (204, 304) or method == b"HEAD":
        return _Unframer("length"), keep
    if chunked:
        return _Unframer("chunked"), keep
    if length is not None:
        return _Unframer("length", length), keep
    return _Unframer("eof"), False


class BodyParts(httpx.AsyncByteStream):
    """A request body sent as the parts it was made in (one write, not joined first); it
    can be sent again."""

    def __init__(self, parts: Sequence[bytes]) -> None:
        self.parts = parts
        self.length = sum(len(part) for part in parts)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


class _ResponseBody(httpx.AsyncByteStream):
    """A response's body from its connection, which goes back to the pool only when the
    body was read to its end and both sides keep it."""

    def __init__(
        self,
        pool: Http11Transport,
        connection: _Connection,
        unframer: _Unframer,
        keep: bool,
        received: bytes,
        timeout: float | None,
    ) -> None:
        self._pool = pool
        self._connection = connection
        self._unframer = unframer
        self._keep = keep
        self._received = received  # past the head, before the body was asked for
        self._timeout = timeout
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        unframer = self._unframer
        if self._received:
            data = unframer.feed(self._received)
            self._received = b""
            if data:
                yield data
        read = self._connection.channel.read
        while not unframer.done:
            data = unframer.feed(await read(self._timeout))
            if data:
                yield data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        unframer = self._unframer
        connection = self._connection
        if self._keep and unframer.done and not unframer.extra:
            connection.reset()
            self._pool.release(connection)
        else:
            connection.channel.close()


class Http11Transport(httpx.AsyncBaseTransport):
    """Plain HTTP/1.1 (``http://`` and ``https://``) for an httpx client's direct
    routes, verifying TLS with ``ssl_context``."""

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        # The protocol every connection offers (the same for every client that shares
        # the context, so setting it here changes nothing for them).
        ssl_context.set_alpn_protocols(["http/1.1"])
        self._ssl = ssl_context
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        scheme = url.raw_scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol("only http and https are supported")
        origin: _Origin = (scheme, url.raw_host, url.port or _DEFAULT_PORTS[scheme])
        connection = self._acquire(origin)
        if connection is not None:
            try:
                return await self._exchange(connection, request, timeouts)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                # A kept connection the server closed as it was taken again (its end was
                # still on the way): the request goes once more, on a new connection.
                # Only when nothing at all came back, and the body can be sent again.
                if connection.channel.received or not isinstance(
                    request.stream, httpx.ByteStream | BodyParts
                ):
                    raise
        connection = await self._connect(origin, timeouts.get("connect"))
        return await self._exchange(connection, request, timeouts)

    async def _exchange(
        self, connection: _Connection, request: httpx.Request, timeouts: dict[str, float | None]
    ) -> httpx.Response:
        """Send ``request`` on ``connection`` and read the response's head."""
        try:
            http = connection.http
            try:
                head = http.send(
                    h11.Request(
                        method=request.method,
                        target=request.url.raw_path,
                        headers=request.headers.raw,
                    )
                )
                parts = [head] if head else []
                assert isinstance(request.stream, httpx.AsyncByteStream)
                async for part in request.stream:
                    if part:
                        parts += http.send_with_data_passthrough(h11.Data(data=part)) or ()
                tail = http.send(h11.EndOfMessage())
            except h11.LocalProtocolError:
                raise httpx.LocalProtocolError("the request cannot be sent") from None
            if tail:
                parts.append(tail)
            try:
                await connection.channel.write(parts, timeouts.get("write"))
            except httpx.WriteError:
                # A server may answer before it read the whole request (a body too large)
                # and close: its answer is the outcome, not the failed write.
                if not connection.channel.has_data:
                    raise
            read_timeout = timeouts.get("read")
            event = await connection.next_event(read_timeout)
            while type(event) is h11.InformationalResponse:
                event = await connection.next_event(read_timeout)
            if type(event) is not h11.Response:
                raise httpx.RemoteProtocolError("the server sent no response")
        except BaseException:
            connection.channel.close()
            raise
        unframer, keep = _unframer(request.method.encode("ascii"), event)
        received, _ = http.trailing_data
        return httpx.Response(
            event.status_code,
            headers=event.headers.raw_items(),
            stream=_ResponseBody(self, connection, unframer, keep, received, read_timeout),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": event.reason},
        )

    def _acquire(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if connection.reusable(now):
                return connection
            connection.channel.close()
        return None

    def release(self, connection: _Connection) -> None:
        """Keep a connection whose exchange ended cleanly for the next request."""
        if self._closed or connection.channel.ended:
            connection.channel.close()
            return
        if self._idle_count >= MAX_IDLE:
            self._drop_oldest()
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._idle_count += 1

    def _drop_oldest(self) -> None:
        oldest = min((idle[0] for idle in self._idle.values() if idle), key=lambda c: c.idle_since)
        self._idle[oldest.origin].remove(oldest)
        self._idle_count -= 1
        oldest.channel.close()

    async def _connect(self, origin: _Origin, timeout: float | None) -> _Connection:
        scheme, raw_host, port = origin
        host = raw_host.decode("ascii")
        loop = asyncio.get_running_loop()
        tls = scheme == b"https"
        try:
            async with asyncio.timeout(timeout):
                sock = await _open_socket(loop, host, port)
                try:
                    _, channel = await loop.create_connection(
                        lambda: _Channel(loop),
                        sock=sock,
                        ssl=self._ssl if tls else None,
                        server_hostname=host if tls else None,
                    )
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting") from None
        except OSError:  # ssl.SSLError included
            raise httpx.ConnectError("could not connect") from None
        return _Connection(origin, channel)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.channel.close()
        self._idle.clear()
        self._idle_count = 0


async def _open_socket(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking socket to ``host``: its addresses raced, each started
    ``HAPPY_EYEBALLS_SECONDS`` after the one before, or as soon as every earlier one
    failed. The first to connect wins; the others are cancelled (closing their sockets)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    attempts: list[asyncio.Task[socket.socket]] = []
    winner: socket.socket | None = None
    try:
        for info in _interleaved(infos):
            attempts.append(loop.create_task(_connect_one(loop, *info)))
            deadline = loop.time() + HAPPY_EYEBALLS_SECONDS
            while (winner := _connected(attempts)) is None:
                pending = [task for task in attempts if not task.done()]
                remaining = deadline - loop.time()
                if not pending or remaining <= 0:
                    break
                await asyncio.wait(pending, timeout=remaining, return_when=FIRST_COMPLETED)
            if winner is not None:
                return winner
        while (winner := _connected(attempts)) is None:
            pending = [task for task in attempts if not task.done()]
            if not pending:
                raise OSError("could not connect to any address")
            await asyncio.wait(pending, return_when=FIRST_COMPLETED)
        return winner
    finally:
        for task in attempts:
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None and task.result() is not winner:
                task.result().close()


def _connected(attempts: list[asyncio.Task[socket.socket]]) -> socket.socket | None:
    for task in attempts:
        if task.done() and not task.cancelled() and task.exception() is None:
            return task.result()
    return None


def _interleaved(infos: Sequence[_AddressInfo]) -> list[_AddressInfo]:
    """Addresses alternating between families, in the resolver's order within each."""
    by_family: dict[int, list[_AddressInfo]] = {}
    for info in infos:
        by_family.setdefault(info[0], []).append(info)
    rounds = itertools.zip_longest(*by_family.values())
    return [info for group in rounds for info in group if info is not None]


async def _connect_one(
    loop: asyncio.AbstractEventLoop,
    family: socket.AddressFamily,
    kind: socket.SocketKind,
    proto: int,
    _canonical_name: str,
    address: tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes],
) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock
