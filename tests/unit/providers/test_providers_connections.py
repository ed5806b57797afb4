"""The service's HTTP clients (httpx's own transport) against real loopback servers:
connections kept only after a response read to its end and while both sides keep them,
replaced when the server closes them; timeouts, truncation and early closes as httpx's
exceptions; TLS verified against the client's CA roots; a hanging address raced by the
next one."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias

import httpx
import pytest
import trustme
from tests.process.daemon.support import wait_for

from magi_code.providers.http import (
    DIRECT,
    MAX_CONNECTIONS,
    MAX_IDLE_CONNECTIONS,
    TransportOptions,
    build_client,
)

Handler: TypeAlias = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback HTTP/1.1 server whose handler answers each request on a connection."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.closed_by_client = 0
        self.open = 0
        self.most_open = 0  # the most connections open at once
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while await read_request(reader) is not None:
                await self.handler(reader, writer)
                if writer.is_closing():
                    return
            self.closed_by_client += 1
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            self.closed_by_client += 1
        finally:
            self.open -= 1
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's body (``content-length`` framing), or None at the end."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length) if length else b""


def reply(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def stalled_after(data: bytes) -> Handler:
    """A handler that sends ``data``, then nothing more until the client closes."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        await reader.read()

    return handler


@contextlib.asynccontextmanager
async def client(
    options: TransportOptions = DIRECT, timeout: httpx.Timeout | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The client the service builds for ``options``, with ``timeout`` for its requests."""
    async with build_client(options) as made:
        if timeout is not None:
            made.timeout = timeout
        yield made


async def test_a_response_read_to_its_end_leaves_its_connection_for_the_next_request() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: 2\n\n") + b"0\r\n\r\n")

    async with Server(handler) as server, client() as http:
        for _ in range(3):
            async with http.stream("POST", server.url + "/v1", content=b"{}") as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "text/event-stream"
                assert b"".join([c async for c in response.aiter_bytes()]) == (
                    b"data: 1\n\ndata: 2\n\n"
                )
        plain = await http.get(server.url + "/models")
        assert plain.content == b"data: 1\n\ndata: 2\n\n"
    assert server.connections == 1


async def test_a_route_opens_at_most_its_limit_and_keeps_at_most_its_idle_connections() -> None:
    # Every request is held until the limit's worth have arrived, so that many connections
    # are in use at once; the one request more waits for one to be given back (httpcore
    # then closes an idle one over the idle limit and opens its own: never more at once).
    arrived, all_in = 0, asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal arrived
        arrived += 1
        if arrived == MAX_CONNECTIONS:
            all_in.set()
        await all_in.wait()
        writer.write(reply(b"ok"))
        await writer.drain()

    async with Server(handler) as server, client() as http:
        answers = await asyncio.gather(*(http.get(server.url) for _ in range(MAX_CONNECTIONS + 1)))
        assert [a.content for a in answers] == [b"ok"] * (MAX_CONNECTIONS + 1)
        assert server.most_open == MAX_CONNECTIONS
        # Back in the pool, all but the idle limit's worth are closed.
        await wait_for(lambda: server.open == MAX_IDLE_CONNECTIONS, what="the closes")
        # The kept ones serve the next burst.
        opened = server.connections
        await asyncio.gather(*(http.get(server.url) for _ in range(MAX_IDLE_CONNECTIONS)))
        assert server.connections == opened and server.open == MAX_IDLE_CONNECTIONS


async def test_connection_close_from_the_server_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"ok", "connection: close"))
        await writer.drain()
        writer.close()

    async with Server(handler) as server, client() as http:
        for _ in range(2):
            assert (await http.get(server.url)).content == b"ok"
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"ok"))
        await writer.drain()
        writer.close()  # without saying so: the client sees the end while idle

    async with Server(handler) as server, client() as http:
        assert (await http.get(server.url)).content == b"ok"
        await asyncio.sleep(0.2)  # the end of the idle connection arrives
        assert (await http.get(server.url)).content == b"ok"
    assert server.connections == 2


async def test_a_gap_between_chunks_longer_than_the_read_timeout_fails_and_closes() -> None:
    handler = stalled_after(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
    async with Server(handler) as server, client(timeout=httpx.Timeout(5, read=0.2)) as http:
        async with http.stream("GET", server.url) as response:
            chunks = response.aiter_bytes()
            assert await anext(chunks) == b"data: 1\n\n"
            with pytest.raises(httpx.ReadTimeout):
                await anext(chunks)
        await wait_for(lambda: server.closed_by_client == 1, 5, "the client to close")


async def test_a_body_cut_short_is_a_remote_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()
        writer.close()

    async with Server(handler) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            async with http.stream("GET", server.url) as response:
                async for _ in response.aiter_bytes():
                    pass


async def test_no_response_at_all_is_a_remote_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with Server(handler) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get(server.url)


async def test_a_response_closed_early_takes_its_connection_and_the_next_request_works() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            for _ in range(50):
                await asyncio.sleep(0.01)
                writer.write(chunk(b"data: more\n\n"))
                await writer.drain()
        writer.write(b"0\r\n\r\n")

    async with Server(handler) as server, client() as http:
        async with http.stream("GET", server.url) as response:
            assert await anext(response.aiter_bytes()) == b"data: 1\n\n"
        async with http.stream("GET", server.url) as response:
            assert await anext(response.aiter_bytes()) == b"data: 1\n\n"
    assert server.connections == 2


async def test_a_server_that_takes_no_request_is_a_write_timeout() -> None:
    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with client(timeout=httpx.Timeout(5, write=0.3)) as http:
            with pytest.raises(httpx.WriteTimeout):
                await http.post(f"http://127.0.0.1:{port}/", content=b"x" * (64 * 2**20))
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def server_tls(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    return context


async def test_tls_to_a_server_the_ca_file_trusts_and_not_with_the_bundled_roots(
    authority: trustme.CA, tmp_path: Path
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"secure"))

    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    async with Server(handler, server_tls(authority)) as server:
        async with client(TransportOptions(ca_file=str(ca_file))) as http:
            for _ in range(2):
                assert (await http.get(server.url)).content == b"secure"
        assert server.connections == 1
        async with client() as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(server.url)


async def test_an_address_that_hangs_is_raced_by_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A listener whose accept queue is full drops new SYNs: connecting to it hangs.
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(0)
    filler = [socket.socket() for _ in range(4)]
    for sock in filler:
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(hanging.getsockname())

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"second"))

    try:
        async with Server(handler) as server:
            loop = asyncio.get_running_loop()

            async def resolve(host: str, port: int, **_: Any) -> list[Any]:
                kind = socket.SOCK_STREAM
                return [
                    (socket.AF_INET, kind, 6, "", hanging.getsockname()),
                    (socket.AF_INET, kind, 6, "", ("127.0.0.1", server.port)),
                ]

            monkeypatch.setattr(loop, "getaddrinfo", resolve)
            async with client(timeout=httpx.Timeout(5, connect=3)) as http:
                response = await http.get(f"http://example.invalid:{server.port}/")
                assert response.content == b"second"
    finally:
        hanging.close()
        for sock in filler:
            sock.close()
