"""The peer's PID from its socket credentials (the tool barrier's input)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from magi_code.endpoint import peer
from magi_code.endpoint.peer import peer_pid

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_PEERCRED")

CONNECT_AND_WAIT = """
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.connect(sys.argv[1])
    sock.recv(1)
"""


def test_socketpair_peer_is_this_process() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_pid(left) == os.getpid()
        assert peer_pid(right) == os.getpid()


def test_the_pid_is_the_connecting_process(tmp_path: Path) -> None:
    path = str(tmp_path / "daemon.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        listener.settimeout(10)
        client = subprocess.Popen([sys.executable, "-c", CONNECT_AND_WAIT, path])
        try:
            server_side, _ = listener.accept()
            with server_side:
                assert peer_pid(server_side) == client.pid != os.getpid()
                server_side.sendall(b"x")
        finally:
            assert client.wait(timeout=10) == 0


async def _transport_pid(path: str) -> int | None:
    seen: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(peer_pid(writer.get_extra_info("socket")))
        writer.close()

    server = await asyncio.start_unix_server(on_connect, path)
    async with server:
        _reader, writer = await asyncio.open_unix_connection(path)
        result = await asyncio.wait_for(seen, timeout=10)
        writer.close()
    return result


Runner = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_transport_sockets_of_both_event_loops(tmp_path: Path, run: Runner) -> None:
    assert run(_transport_pid(str(tmp_path / "d.sock"))) == os.getpid()


@linux_only
def test_tcp_and_closed_sockets_have_no_pid() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as client,
    ):
        server_side, _ = listener.accept()
        with server_side:
            assert peer_pid(server_side) is None
            assert peer_pid(client) is None
    left, right = socket.socketpair()
    left.close()
    right.close()
    assert peer_pid(left) is None


class _LocalSocket:
    """A macOS-style socket answering ``LOCAL_PEERPID`` (SOL_LOCAL 0, option 2) only."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.asked: list[tuple[int, int, int]] = []

    def fileno(self) -> int:
        return -1

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes:
        self.asked.append((level, optname, buflen))
        if (level, optname) != (0, 2):
            raise OSError("unexpected option")
        return self.answer


def test_darwin_reads_local_peerpid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer, "_PLATFORM", "darwin")
    monkeypatch.delattr(socket, "SOL_LOCAL", raising=False)
    monkeypatch.delattr(socket, "LOCAL_PEERPID", raising=False)
    sock = _LocalSocket(struct.pack("=i", 4242))
    assert peer_pid(sock) == 4242
    assert sock.asked == [(0, 2, 4)]
    assert peer_pid(_LocalSocket(b"\x01")) is None  # short answer
    assert peer_pid(_LocalSocket(struct.pack("=i", 0))) is None


def test_platforms_without_a_peer_pid_say_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer, "_PLATFORM", "freebsd14")
    assert peer_pid(_LocalSocket(struct.pack("=i", 4242))) is None
