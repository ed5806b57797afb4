"""Many connect/disconnect cycles against one daemon leak no fds, threads or memory.

Cycles mix: hello of each role then close, hello then a request then close without
reading, abrupt close before the hello, close in the middle of a frame, a reset
(``SO_LINGER`` 0) after the hello, and bursts of connections held open together. The
daemon's fd count (``/proc/<pid>/fd``), threads and RSS are measured after a warm-up
and again once every connection is gone.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
from pathlib import Path

import pytest

from magi_code.client import socket_for
from magi_code.client.channel import launch_of
from magi_code.protocol import envelope
from magi_code.protocol.frames import FrameDecoder, encode_frame
from magi_code.protocol.v2 import hello
from tests.process.daemon.support import cli, context, status
from tests.stress.support import (
    TIMEOUT,
    daemon_log,
    proc_figures,
    report,
    rng,
    scaled,
    tracebacks,
    wait_until,
)

pytestmark = pytest.mark.timeout(TIMEOUT)

FD_SLACK = 8
THREAD_SLACK = 8
RSS_SLACK_MIB = 48
KINDS = ("hello", "hello_request", "no_hello", "mid_frame", "reset", "burst")


def _welcome(sock: socket.socket) -> dict[str, object]:
    sock.settimeout(10)
    decoder = FrameDecoder()
    while not (frames := decoder.feed(sock.recv(65536))):
        pass
    return frames[0]


def _cycle(kind: str, home: Path, project: Path, role: str) -> int:
    """One connection (or a burst); returns how many connections it made."""
    path = str(socket_for(context(home, project)))
    opening = encode_frame(hello(role, launch_of(context(home, project)), "churn", "0"))  # type: ignore[arg-type]
    if kind == "burst":
        held = []
        for _ in range(16):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            sock.sendall(opening)
            held.append(sock)
        for sock in held:
            assert _welcome(sock)["t"] == "welcome"
            sock.close()
        return len(held)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if kind == "no_hello":
            return 1
        if kind == "mid_frame":
            sock.sendall(opening[: len(opening) // 2])
            return 1
        sock.sendall(opening)
        assert _welcome(sock)["t"] == "welcome"
        if kind == "hello_request":
            if role == "persistent":
                init = envelope.request("i", "initialize", {"supported_protocol_versions": [1]})
                sock.sendall(encode_frame({"t": "request", "message": init}))
            elif role == "v1_shim":
                sock.sendall(encode_frame({"t": "record", "data": b'{"x":1}'}))
            else:
                sock.sendall(encode_frame({"t": "control", "id": 1, "op": "status"}))
        if kind == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return 1
    finally:
        sock.close()


async def test_connect_disconnect_cycles_leak_nothing(home: Path, project: Path) -> None:
    r = rng("churn")
    cycles = scaled(200, 1000)
    started = await asyncio.to_thread(cli, home, "daemon", "start")
    assert started.returncode == 0, started.stderr
    pid = (await asyncio.to_thread(status, home))["pid"]
    start = proc_figures(pid)

    def settled() -> bool:
        return status(home)["clients"] == 0

    def run(count: int) -> collections.Counter[str]:
        kinds: collections.Counter[str] = collections.Counter()
        for _ in range(count):
            kind = r.choice(KINDS)
            role = r.choice(["persistent", "v1_shim", "control"])
            kinds[kind] += _cycle(kind, home, project, role)
        return kinds

    await asyncio.to_thread(run, 20)  # warm-up: lazily created pools, caches
    await wait_until(settled, 60, "the warm-up connections to go")
    baseline = proc_figures(pid)
    kinds = await asyncio.to_thread(run, cycles)
    at_end = proc_figures(pid)  # the last connections may still be closing
    await wait_until(settled, 60, "every connection to be gone")
    # The daemon closes its side asynchronously: wait (generously) for the fds to go.
    await wait_until(
        lambda: proc_figures(pid).fds <= baseline.fds + FD_SLACK, 30, "the fds to be closed"
    )
    after = proc_figures(pid)
    assert after.fds <= baseline.fds + FD_SLACK, (baseline, after)
    assert after.threads <= baseline.threads + THREAD_SLACK, (baseline, after)
    assert (after.rss_kib - baseline.rss_kib) / 1024 < RSS_SLACK_MIB, (baseline, after)
    assert status(home)["pid"] == pid
    log = daemon_log(home)
    assert "Traceback" not in log, "\n".join(tracebacks(log))
    report(
        "churn",
        cycles=cycles,
        connections=sum(kinds.values()),
        kinds=dict(sorted(kinds.items())),
        start=start,
        baseline=baseline,
        at_end=at_end,
        after=after,
    )
