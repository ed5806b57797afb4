"""Clients that flood requests and never read cannot grow the daemon or starve others.

N persistent connections send ``status`` requests and ``control`` frames as fast as the
socket takes them and never read an answer. The daemon must stop reading each of them
(our sends block long before the per-client cap of this test), keep answering a
well-behaved client meanwhile, and drop every flooder once its unread answers have
waited ``MC_DAEMON_CLIENT_TIMEOUT_SECONDS`` (2 here, inherited from the starter); and
once they are gone, give the memory they cost back to the system.
"""

from __future__ import annotations

import asyncio
import platform
import socket
import threading
import time
from pathlib import Path

import pytest

from magi_code.client import socket_for
from magi_code.client.channel import launch_of
from magi_code.protocol import envelope
from magi_code.protocol.frames import encode_frame
from magi_code.protocol.v2 import hello
from tests.process.daemon.support import cli, context, persistent, status
from tests.stress.support import (
    TIMEOUT,
    ProcFigures,
    daemon_log,
    proc_figures,
    report,
    scaled,
    tracebacks,
    wait_until,
)

pytestmark = pytest.mark.timeout(TIMEOUT)

# Stalled clients dropped after 2 s; no idle stop: on a loaded machine the rounds and the
# wait for the freed heap can leave the daemon without a client for its 60 s.
FAST = {"MC_DAEMON_CLIENT_TIMEOUT_SECONDS": "2", "MC_DAEMON_IDLE_SECONDS": "0"}
# A flooder that got this far was never stopped: far beyond the daemon's bounds (inbox
# 1 MiB, unread answers 1 MiB) plus the kernel's socket buffers.
CAP_BYTES = 256 * 1024 * 1024


class Flooder:
    def __init__(self, home: Path, project: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(socket_for(context(home, project))))
        opening = hello("persistent", launch_of(context(home, project)), "flood", "0")
        init = envelope.request("init", "initialize", {"supported_protocol_versions": [1]})
        self.sock.sendall(encode_frame(opening) + encode_frame({"t": "request", "message": init}))
        self.sock.setblocking(False)
        burst = b"".join(
            encode_frame({"t": "request", "message": envelope.request(f"s{i}", "status", {})})
            + encode_frame({"t": "control", "id": i, "op": "status"})
            for i in range(64)
        )
        self.burst = memoryview(burst)
        self.offset = 0
        self.sent = 0
        self.blocked = False  # the last send found the socket full
        self.dropped = False

    def pump(self) -> bool:
        """Send what the socket takes now; False once the daemon dropped us (or the cap)."""
        if self.dropped or self.sent >= CAP_BYTES:
            return False
        try:
            n = self.sock.send(self.burst[self.offset :])
        except BlockingIOError:
            self.blocked = True
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.dropped = True
            return False
        self.blocked = False
        self.sent += n
        self.offset = (self.offset + n) % len(self.burst)
        return True


def _flood(flooders: list[Flooder], pid: int, stop: threading.Event) -> int:
    """Pump every flooder until the daemon dropped it (or ``stop``); the peak RSS in KiB."""
    peak = 0
    active = list(flooders)
    while active and not stop.is_set():
        active = [f for f in active if f.pump()]
        peak = max(peak, proc_figures(pid).rss_kib)
        time.sleep(0.005)
    return peak


async def _flood_round(home: Path, project: Path, pid: int, count: int) -> tuple[int, int, int]:
    """One round: ``count`` flooders until dropped, a client served meanwhile.

    Returns (peak RSS in KiB, bytes the flooders sent, answers the other client got).
    """
    flooders = [Flooder(home, project) for _ in range(count)]
    stop = threading.Event()
    flood = asyncio.ensure_future(asyncio.to_thread(_flood, flooders, pid, stop))
    answered = 0
    try:
        await wait_until(
            lambda: all(f.blocked or f.dropped for f in flooders),
            60,
            "the daemon to stop reading every flooder",
        )
        # Meanwhile a well-behaved client is answered, request after request.
        client = await persistent(home, project)
        try:
            for _ in range(20):
                reply = await client.request("status", {})
                assert reply["error"] is None, reply
                answered += 1
            created = await client.request("session.create")
            assert created["error"] is None, created
            listed = await client.request("session.list")
            assert listed["error"] is None, listed
            answered += 2
        finally:
            await client.close()
        assert (await asyncio.to_thread(status, home))["running"] is True
        # Every flooder is dropped (a send fails) without ever having read a byte.
        await wait_until(lambda: flood.done(), 120, "every flooder to be dropped")
        peak_kib = await flood
    finally:
        stop.set()
        await asyncio.gather(flood, return_exceptions=True)
        for flooder in flooders:
            flooder.sock.close()
    for flooder in flooders:
        assert flooder.sent < CAP_BYTES, "the daemon kept reading a client that never reads"
    assert all(f.dropped for f in flooders)
    await wait_until(lambda: status(home)["clients"] == 0, 60, "the clients to be gone")
    return peak_kib, sum(f.sent for f in flooders), answered


async def _warmed_figures(home: Path, pid: int) -> ProcFigures:
    """The daemon's figures once the warm-up it runs just after it is ready is over: the
    sandbox probe has answered (it follows the turn modules' import) and RSS has held still
    for half a second (the CA roots load beside the probe). Taken earlier, the baseline
    would leave out several MiB the flooders never added."""

    def probed() -> bool:
        return status(home)["sandbox"]["workspace_write"] is not None

    await wait_until(probed, 60, "the daemon's warm-up")
    figures, held_since = proc_figures(pid), time.monotonic()
    while time.monotonic() - held_since < 0.5:
        await asyncio.sleep(0.05)
        now = proc_figures(pid)
        if now.rss_kib != figures.rss_kib:
            figures, held_since = now, time.monotonic()
    return figures


async def test_non_reading_clients_are_bounded_and_dropped_while_others_are_served(
    home: Path, project: Path
) -> None:
    count = scaled(4, 16)
    rounds = scaled(2, 4)
    started = await asyncio.to_thread(cli, home, "daemon", "start", extra=FAST)
    assert started.returncode == 0, started.stderr
    pid = (await asyncio.to_thread(status, home))["pid"]
    before = await _warmed_figures(home, pid)
    peaks, sent, answered = [], 0, 0
    for _ in range(rounds):
        peak_kib, round_sent, round_answered = await _flood_round(home, project, pid, count)
        peaks.append(peak_kib)
        sent += round_sent
        answered += round_answered
    grown_mib = (peaks[0] - before.rss_kib) / 1024
    # Nominally ~2 MiB a flooder (1 MiB inbox, 1 MiB unread answers); allow allocator
    # overhead, but not growth with the volume flooded: later rounds reuse the memory.
    assert grown_mib < 32 + 8 * count, f"RSS grew {grown_mib:.0f} MiB for {count} flooders"
    later_mib = (max(peaks) - peaks[0]) / 1024
    assert later_mib < 16 + 2 * count, f"RSS kept growing: peaks {peaks} KiB"
    if platform.libc_ver()[0] == "glibc":
        # With the flooders gone the daemon gives the freed heap back (daemon/heap.py):
        # at least a third of what they added (about half here), where glibc alone
        # would keep it all. A short run's few flooders add little beside what a
        # daemon's first flood leaves for good (the trimmer's worker thread and its
        # arena, modules loaded on first use: ~8 MiB): that much may stay.
        peak = max(peaks)
        settled_kib = max(peak - (peak - before.rss_kib) // 3, before.rss_kib + 12 * 1024)
        await wait_until(
            lambda: proc_figures(pid).rss_kib < settled_kib, 60, "the freed heap to be returned"
        )
    after = proc_figures(pid)
    log = daemon_log(home)
    assert "Traceback" not in log, "\n".join(tracebacks(log))
    stalled = log.count("code=client_stalled")
    assert stalled >= count * rounds, f"{stalled} client_stalled for {count * rounds} flooders"
    assert status(home)["pid"] == pid
    report(
        "nonreading",
        rounds=rounds,
        flooders_per_round=count,
        bytes_sent=sent,
        dropped=count * rounds,
        client_stalled=stalled,
        answered_meanwhile=answered,
        before=before,
        peak_rss_per_round="/".join(f"{p / 1024:.1f}MiB" for p in peaks),
        after=after,
        first_round_growth_mib=f"{grown_mib:.1f}",
    )
