"""Peer credentials over real Unix sockets: plain, asyncio and uvloop transports, foreign UID."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from magi_code.endpoint.peer import PeerCredentialsUnavailable, check_peer, peer_uid

NOBODY = 65534

FOREIGN_CLIENT = """
import os, socket, sys
from magi_code.endpoint.peer import check_peer, peer_uid
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.connect(sys.argv[1])
    print(peer_uid(sock), check_peer(sock), flush=True)
    sock.recv(1)
"""


@pytest.fixture
def sock_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """World-reachable dir, only so the foreign-UID client can reach the socket."""
    path = Path(tempfile.mkdtemp(prefix="mc-peer-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_socketpair_peer_is_us() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_uid(left) == os.geteuid()
        assert check_peer(left) and check_peer(right)


def test_both_ends_of_a_bound_unix_socket_see_our_uid(sock_dir: Path) -> None:
    path = str(sock_dir / "daemon.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            server_side, _ = listener.accept()
            with server_side:
                assert peer_uid(server_side) == os.geteuid()
                assert peer_uid(client) == os.geteuid()
                assert check_peer(server_side) and check_peer(client)


def test_tcp_peer_is_never_accepted() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as client,
    ):
        server_side, _ = listener.accept()
        with server_side:
            assert not check_peer(server_side)
            assert not check_peer(client)


def test_closed_socket_fails_closed() -> None:
    left, right = socket.socketpair()
    right.close()
    left.close()
    with pytest.raises(PeerCredentialsUnavailable):
        peer_uid(left)
    assert check_peer(left) is False


Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS: dict[str, Runner] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


async def transport_peer_results(path: str) -> tuple[str, int, bool, int, bool]:
    seen: asyncio.Future[tuple[str, int, bool]] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        seen.set_result((type(sock).__name__, peer_uid(sock), check_peer(sock)))
        writer.close()

    server = await asyncio.start_unix_server(on_connect, path)
    async with server:
        _reader, writer = await asyncio.open_unix_connection(path)
        client_sock = writer.get_extra_info("socket")
        client_uid, client_ok = peer_uid(client_sock), check_peer(client_sock)
        kind, server_uid, server_ok = await asyncio.wait_for(seen, timeout=10)
        writer.close()
    return kind, server_uid, server_ok, client_uid, client_ok


@pytest.mark.parametrize("loop_name", sorted(RUNNERS))
def test_transport_socket_of_event_loops(sock_dir: Path, loop_name: str) -> None:
    kind, server_uid, server_ok, client_uid, client_ok = RUNNERS[loop_name](
        transport_peer_results(str(sock_dir / "daemon.sock"))
    )
    assert kind == ("PseudoSocket" if loop_name == "uvloop" else "TransportSocket")
    assert server_uid == client_uid == os.geteuid()
    assert server_ok and client_ok


async def foreign_client_results(path: str) -> tuple[int, bool, str]:
    seen: asyncio.Future[tuple[int, bool]] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        seen.set_result((peer_uid(sock), check_peer(sock)))
        await reader.read(1)  # the client's view is printed before we close
        writer.close()

    server = await asyncio.start_unix_server(on_connect, path)
    os.chmod(path, 0o777)
    async with server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FOREIGN_CLIENT, path, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        client_view = (await asyncio.wait_for(proc.stdout.readline(), timeout=10)).decode()
        server_uid, server_ok = await asyncio.wait_for(seen, timeout=10)
        proc.kill()
        await asyncio.wait_for(proc.wait(), timeout=10)
    return server_uid, server_ok, client_view.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_foreign_uid_is_rejected_on_both_ends_through_uvloop(shared_dir: Path) -> None:
    server_uid, server_ok, client_view = uvloop.run(
        foreign_client_results(str(shared_dir / "daemon.sock"))
    )
    assert server_uid == NOBODY
    assert server_ok is False
    assert client_view == f"{os.geteuid()} False"
