"""The provider clients' HTTP/1.1 transport against real loopback servers: connections
kept only after a response read to its end and while both sides keep them, dropped when
the server closes them or they expire; timeouts, truncation, refusal, cancellation and
early closes as httpx's exceptions with fixed messages; flow control both ways; TLS
verified against the client's CA; a hanging address raced by the next one."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import httpx
import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st
from tests.process.daemon.support import wait_for

from magi_code.providers import transport as transport_module
from magi_code.providers.http import DIRECT, build_client
from magi_code.providers.transport import BodyParts, Http11Transport

Handler: TypeAlias = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback HTTP/1.1 server whose handler answers each request on a connection."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.closed_by_client = 0
        self.bodies: list[bytes] = []  # every request's body, in order
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
        try:
            while (body := await read_request(reader)) is not None:
                self.bodies.append(body)
                await self.handler(reader, writer)
                if writer.is_closing():
                    return
            self.closed_by_client += 1
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            self.closed_by_client += 1
        finally:
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
async def client(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=Http11Transport(ssl.create_default_context()), **settings
    ) as made:
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


def once_per_connection() -> Handler:
    """A handler that answers one request per connection, ``ok <n>`` on the n-th, and
    closes a kept connection when the next request arrives on it."""
    served: list[asyncio.StreamWriter] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if writer in served:
            writer.close()
            return
        served.append(writer)
        writer.write(reply(b"ok %d" % len(served)))

    return handler


async def test_a_kept_connection_closed_as_it_is_reused_is_replaced_for_the_request() -> None:
    async with Server(once_per_connection()) as server, client() as http:
        assert (await http.post(server.url, content=b"{}")).content == b"ok 1"
        assert (await http.post(server.url, content=b"{}")).content == b"ok 2"
    assert server.connections == 2


async def test_a_body_in_parts_is_sent_whole_and_again_on_a_replaced_connection() -> None:
    body = BodyParts([b'{"a":', b"[1,2]", b"}"])
    async with Server(once_per_connection()) as server, client() as http:
        headers = {"host": f"127.0.0.1:{server.port}", "content-length": str(body.length)}
        for expected in (b"ok 1", b"ok 2"):
            request = httpx.Request("POST", server.url, stream=body, headers=headers)
            assert (await http.send(request)).content == expected
    # The second request twice: on the kept connection (closed), then on a new one.
    assert server.bodies == [b'{"a":[1,2]}'] * 3
    assert server.connections == 2


async def test_an_idle_connection_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "KEEPALIVE_SECONDS", 0.0)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"ok"))

    async with Server(handler) as server, client() as http:
        for _ in range(2):
            assert (await http.get(server.url)).content == b"ok"
    assert server.connections == 2


async def test_a_gap_between_chunks_longer_than_the_read_timeout_fails_and_closes() -> None:
    handler = stalled_after(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
    async with Server(handler) as server, client(timeout=httpx.Timeout(5, read=0.2)) as http:
        async with http.stream("GET", server.url) as response:
            chunks = response.aiter_bytes()
            assert await anext(chunks) == b"data: 1\n\n"
            with pytest.raises(httpx.ReadTimeout) as caught:
                await anext(chunks)
        assert str(server.port) not in str(caught.value)
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


async def test_a_refused_connection_is_a_connect_error_without_the_address() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    async with client() as http:
        with pytest.raises(httpx.ConnectError) as caught:
            await http.get(f"http://127.0.0.1:{port}/")
    assert str(port) not in str(caught.value) and "127.0.0.1" not in str(caught.value)


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


async def test_a_cancelled_read_closes_the_connection() -> None:
    async with Server(stalled_after(CHUNKED_HEAD)) as server, client() as http:

        async def read() -> None:
            async with http.stream("GET", server.url) as response:
                async for _ in response.aiter_bytes():
                    pass

        task = asyncio.create_task(read())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: server.closed_by_client == 1, 5, "the client to close")


async def test_large_bodies_both_ways_with_a_slow_reader() -> None:
    sent = bytes(range(256)) * (16 * 1024)  # 4 MiB each way

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(sent))
        await writer.drain()

    async with Server(handler) as server, client() as http:
        async with http.stream("POST", server.url, content=sent) as response:
            received = bytearray()
            async for part in response.aiter_raw():
                received += part
                await asyncio.sleep(0)  # slower than the socket: reading pauses and resumes
        assert bytes(received) == sent
        assert (await http.get(server.url)).content == sent
    assert server.connections == 1


async def test_a_reader_that_does_not_read_stops_the_socket_being_read() -> None:
    total = 64 * 2**20
    written = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n".encode())
        block = b"x" * 2**20
        with contextlib.suppress(ConnectionError):
            while written < total:
                writer.write(block)
                await writer.drain()
                written += len(block)

    async with (
        Server(handler) as server,
        client() as http,
        http.stream("GET", server.url) as response,
    ):
        await asyncio.sleep(0.5)
        # Received and kept: at most the high mark; the rest waits in the kernel's
        # buffers and the server's.
        assert written < total // 2
        assert await anext(response.aiter_raw())


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


async def test_an_answer_before_the_whole_request_was_taken_is_the_response() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only, not the body
        writer.write(b"HTTP/1.1 413 Too Large\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbig")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with client() as http:
            response = await http.post(f"http://127.0.0.1:{port}/", content=b"x" * (64 * 2**20))
        assert (response.status_code, response.content) == (413, b"big")
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


async def test_tls_to_a_server_the_context_trusts_and_not_to_another(
    authority: trustme.CA,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"secure"))

    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    async with Server(handler, server_tls(authority)) as server:
        async with httpx.AsyncClient(transport=Http11Transport(trusting)) as http:
            for _ in range(2):
                assert (await http.get(server.url)).content == b"secure"
        assert server.connections == 1
        # The service's own client: the bundled roots do not know this CA.
        direct = build_client(DIRECT)
        try:
            with pytest.raises(httpx.ConnectError):
                await direct.get(server.url)
        finally:
            await direct.aclose()


async def test_the_service_client_sends_its_requests_through_this_transport() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(reply(b"ok"))

    direct = build_client(DIRECT)
    try:
        async with Server(handler) as server:
            for _ in range(2):
                assert (await direct.get(server.url)).content == b"ok"
        assert server.connections == 1
        assert isinstance(direct._transport, Http11Transport)
    finally:
        await direct.aclose()


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


def test_addresses_alternate_between_families() -> None:
    six = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (f"::{i}", 1, 0, 0)) for i in (1, 2)]
    four = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (f"10.0.0.{i}", 1)) for i in (1, 2, 3)]
    ordered = transport_module._interleaved([*six, *four])
    assert [info[4][0] for info in ordered] == ["::1", "10.0.0.1", "::2", "10.0.0.2", "10.0.0.3"]


# -- body framing (sans I/O) ---------------------------------------------------------------


def chunked_wire(pieces: list[bytes], extension: bytes, trailer: bytes) -> bytes:
    wire = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces if p)
    return wire + b"0\r\n" + trailer + b"\r\n"


def fed(unframer: transport_module._Unframer, wire: bytes, cuts: list[int]) -> bytes:
    out = bytearray()
    start = 0
    for cut in [*sorted({c % (len(wire) + 1) for c in cuts}), len(wire)]:
        if cut > start:
            out += unframer.feed(wire[start:cut])
            start = cut
    return bytes(out)


@given(
    pieces=st.lists(st.binary(max_size=40), max_size=8),
    extension=st.sampled_from([b"", b";a=b", b" ; name"]),
    trailer=st.sampled_from([b"", b"x-trailer: 1\r\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_a_chunked_body_fed_in_any_pieces_gives_its_payload(
    pieces: list[bytes], extension: bytes, trailer: bytes, cuts: list[int]
) -> None:
    unframer = transport_module._Unframer("chunked")
    assert fed(unframer, chunked_wire(pieces, extension, trailer), cuts) == b"".join(pieces)
    assert unframer.done and not unframer.extra


@given(payload=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_a_body_of_a_length_gives_exactly_that_many_bytes(payload: bytes, cuts: list[int]) -> None:
    unframer = transport_module._Unframer("length", len(payload))
    assert fed(unframer, payload, cuts) == payload
    assert unframer.done and not unframer.extra


def test_what_follows_a_body_is_not_payload_and_costs_the_connection() -> None:
    by_length = transport_module._Unframer("length", 3)
    assert by_length.feed(b"abcdef") == b"abc"
    assert by_length.done and by_length.extra
    chunked = transport_module._Unframer("chunked")
    assert chunked.feed(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1") == b"abc"
    assert chunked.done and chunked.extra


@pytest.mark.parametrize(
    "wire",
    [b"zz\r\n", b"3\r\nabcX\r\n", b"-1\r\n", b"1" * 5000, b"3;" + b"x" * 5000 + b"\r\n"],
)
def test_a_malformed_chunked_body_is_a_remote_protocol_error(wire: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        transport_module._Unframer("chunked").feed(wire)


def test_a_body_that_ends_early_is_an_error_unless_the_end_is_its_framing() -> None:
    for unframer, part in (
        (transport_module._Unframer("length", 5), b"abc"),
        (transport_module._Unframer("chunked"), b"3\r\nab"),
    ):
        unframer.feed(part)
        with pytest.raises(httpx.RemoteProtocolError):
            unframer.feed(b"")
    until_the_end = transport_module._Unframer("eof")
    assert until_the_end.feed(b"all") == b"all" and not until_the_end.done
    assert until_the_end.feed(b"") == b"" and until_the_end.done
