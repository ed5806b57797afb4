"""Careless and hostile clients cannot grow a real daemon's memory or lock others out.

Each test reproduces a defect an adversarial run found (issues #12, #37): a client that
sends but never reads, connections holding partial frames, too many connections, a low fd
limit inherited from the starter, stalled v1 shims, one client holding every turn, a
client that speaks as a shim and ignores the v1 bounds.
Counts, not clocks, decide: the daemon's short client timeout is set through its
environment so the stalls end quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson

from magi_code.client import Channel, Client, socket_for
from magi_code.client.channel import launch_of
from magi_code.protocol import envelope
from magi_code.protocol.frames import HEADER, FrameDecoder, encode_frame
from magi_code.protocol.limits import MAX_JSON_DEPTH, MAX_RECORD_BYTES
from magi_code.protocol.v2 import hello
from tests.process.daemon.support import (
    alive,
    cli,
    context,
    paths,
    replay_in_new_shim,
    status,
    wait_for,
)
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess, service_env

FAST = {"MC_DAEMON_CLIENT_TIMEOUT_SECONDS": "2"}
# Where no client of the daemon reads anything big (raw sockets, one-line controls).
FASTER = {"MC_DAEMON_CLIENT_TIMEOUT_SECONDS": "1"}


def _start(home: Path, project: Path, extra: dict[str, str] | None = None) -> int:
    result = cli(home, "daemon", "start", extra=extra)
    assert result.returncode == 0, result.stderr
    pid: int = status(home)["pid"]
    return pid


def _connect(home: Path, project: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(socket_for(context(home, project))))
    return sock


def _raw(home: Path, project: Path) -> socket.socket:
    """A connected persistent client that said hello (its welcome not yet read)."""
    sock = _connect(home, project)
    sock.sendall(encode_frame(hello("persistent", launch_of(context(home, project)), "t", "0")))
    return sock


def _frames(sock: socket.socket, timeout: float = 20.0) -> list[dict[str, object]]:
    """Every frame until the daemon closes the connection."""
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    frames: list[dict[str, object]] = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            frames += decoder.feed(chunk)
    return frames


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_sends_but_never_reads_is_paused_bounded_and_dropped(
    home: Path, project: Path
) -> None:
    pid = _start(home, project, FASTER)
    flood = _raw(home, project)
    flood.setblocking(False)
    before = _rss_kib(pid)
    request = encode_frame(
        {
            "t": "request",
            "message": envelope.request("r", "initialize", {"supported_protocol_versions": [1]}),
        }
    )
    status_frame = encode_frame({"t": "control", "id": 1, "op": "status"})
    sent = 0
    most_kib = before
    with contextlib.suppress(BlockingIOError):
        flood.send(request)
    # Send until the daemon drops the connection: it stops taking frames once 1 MiB of
    # answers is unread, so its reading stops, and the client that reads none of them is
    # dropped after its timeout. Only the failure bound is a clock.
    deadline = time.monotonic() + 80
    dropped = False
    while sent < 300_000 and time.monotonic() < deadline:
        try:
            flood.send(status_frame)
            sent += 1
        except BlockingIOError:  # the kernel buffers are full: the daemon is not reading
            most_kib = max(most_kib, _rss_kib(pid))
            time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
            break
    assert dropped, f"the non-reading client was not dropped ({sent} frames sent)"
    grown_mib = (most_kib - before) / 1024
    assert grown_mib < 48, f"daemon RSS grew {grown_mib:.0f} MiB for one non-reading client"
    assert "closing a connection code=client_stalled" in paths(home).log.read_text()
    # Others are served meanwhile, and the dropped client no longer counts.
    wait_for_clients_gone(home)
    flood.setblocking(True)
    frames = _frames(flood, timeout=30)
    assert frames, "expected some answers before the daemon dropped the client"
    assert alive(pid)
    flood.close()


def test_partial_frames_time_out_and_free_their_memory(home: Path, project: Path) -> None:
    pid = _start(home, project, FASTER)
    holders = []
    for _ in range(20):
        sock = _raw(home, project)
        # A header announcing 1 MiB, then only part of the body.
        sock.sendall(HEADER.pack(1024 * 1024) + b"\x00" * (512 * 1024))
        holders.append(sock)
    for sock in holders:
        frames = _frames(sock, timeout=30)
        assert {"t": "error", "code": "frame_timeout"} in [
            {"t": f.get("t"), "code": f.get("code")} for f in frames
        ]
        sock.close()
    assert status(home)["pid"] == pid and status(home)["clients"] == 0


def test_a_silent_connection_is_told_it_missed_the_handshake(home: Path, project: Path) -> None:
    _start(home, project, FASTER)  # the hello deadline is the client timeout when shorter
    sock = _connect(home, project)
    frames = _frames(sock, timeout=30)
    assert [(f["t"], f["code"]) for f in frames] == [("error", "handshake_timeout")]
    sock.close()


def test_connections_are_capped_with_a_clear_refusal_and_control_still_works(
    home: Path, project: Path
) -> None:
    _start(home, project)
    held = [_raw(home, project) for _ in range(256)]
    try:
        for sock in held:  # every one welcomed
            sock.settimeout(20)
            decoder = FrameDecoder()
            while not (got := decoder.feed(sock.recv(65536))):
                pass
            assert got[0]["t"] == "welcome"
        extra = _raw(home, project)
        frames = _frames(extra, timeout=20)
        assert [(f["t"], f.get("code")) for f in frames] == [("refused", "too_many_connections")]
        extra.close()
        assert status(home)["clients"] == 256  # control connections still answered
    finally:
        for sock in held:
            sock.close()
    wait_for_clients_gone(home)


def wait_for_clients_gone(home: Path) -> None:
    # A status the CLI gave up on (a loaded machine's daemon busy past its bound) has none.
    asyncio.run(wait_for(lambda: status(home).get("clients") == 0, what="clients to go"))


def test_the_daemon_lifts_the_fd_limit_it_inherited(home: Path, project: Path) -> None:
    def low_limit() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))

    result = subprocess.run(
        [sys.executable, "-m", "magi_code", "daemon", "start"],
        env=service_env(home),
        preexec_fn=low_limit,
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    pid = status(home)["pid"]
    limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    (line,) = [entry for entry in limits if entry.startswith("Max open files")]
    soft = int(line.split()[3])
    assert soft > 128
    held = [_raw(home, project) for _ in range(200)]  # more than the starter's limit
    for sock in held:
        sock.close()


async def test_a_client_waits_out_a_full_backlog_instead_of_failing_at_once(
    home: Path, project: Path
) -> None:
    # A stopped daemon accepts nothing: fill its listen backlog until connecting would
    # block, as a burst of connections does for a moment to a busy one.
    pid = _start(home, project)
    os.kill(pid, signal.SIGSTOP)
    backlog: list[socket.socket] = []
    try:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(socket_for(context(home, project))))
            except BlockingIOError:
                sock.close()
                break
            backlog.append(sock)
        connecting = asyncio.create_task(Client.connect(context(home, project), "control"))
        await asyncio.sleep(0.5)
        assert not connecting.done(), "the client gave up on a full backlog at once"
    finally:
        os.kill(pid, signal.SIGCONT)
    for sock in backlog:
        sock.close()
    client = await asyncio.wait_for(connecting, 30)
    assert (await client.status())["pid"] == pid
    await client.close()


async def test_a_stalled_v1_shim_is_dropped_and_its_turn_cancelled(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    # ~3 MB of delta events: more than this test's pipe reader buffers (2 MiB) plus the pipe.
    fake.enqueue(Reply(text=["x"] * 16000, after_chunks=16000, ending="stall"))
    fake.stall_timeout = 300  # the provider never ends the turn itself here
    svc = await ServiceProcess.start(home, project, FAST)
    try:
        await svc.initialize()
        await svc.send(envelope.request("t1", "turn.start", {"prompt": "flood"}))
        # The answer precedes the turn's events, and the turn counts as active from it on
        # (polling for the active turn instead could miss it on a loaded machine: each
        # ``daemon status`` is a new process, and the whole turn lasts seconds).
        accepted = await svc.recv()
        assert accepted["request_id"] == "t1" and accepted["error"] is None
        # Never read the shim's stdout again: its pipe fills, it cannot acknowledge.
        await wait_for(lambda: status(home)["active_turns"] == 0, 60, "the stalled turn to end")
        items = await replay_in_new_shim(home, project, accepted["payload"]["session_id"])
        assert [i["status"] for i in items if i["kind"] == "terminal"] == ["cancelled"]
        other = await ServiceProcess.start(home, project)
        try:
            await other.initialize()
            reply = await other.request("status", {})
            assert reply["error"] is None
        finally:
            await other.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):  # the dropped shim may have exited
            svc.proc.kill()
        assert svc.proc.stdout is not None
        await svc.proc.stdout.read()  # the unread output: its pipe only ends once read
        await svc.proc.wait()


async def test_one_client_cannot_hold_the_daemons_turn_ceiling(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.set_default(Reply(text=["x"], ending="stall"))
    greedy = await ServiceProcess.start(home, project)
    other = await ServiceProcess.start(home, project)
    try:
        await greedy.initialize()
        await other.initialize()
        starts = [await greedy.request("turn.start", {"prompt": f"p{i}"}) for i in range(16)]
        assert all(s["error"] is None for s in starts)
        refused = await greedy.request("turn.start", {"prompt": "one more"})
        assert refused["error"]["code"] == "too_many_active_turns"
        accepted = await other.request("turn.start", {"prompt": "mine"})
        assert accepted["error"] is None, accepted
    finally:
        await greedy.stop()
        await other.stop()


async def test_a_client_speaking_as_a_shim_meets_every_v1_bound_in_the_daemon(
    home: Path, project: Path
) -> None:
    pid = _start(home, project)
    ctx = context(home, project)
    channel = await Channel.open(socket_for(ctx), "v1_shim", ctx)

    async def answer(message: object) -> dict[str, object]:
        """Send one record frame; the v1 answer (its write acknowledged, as a shim does)."""
        data = message if isinstance(message, bytes) else orjson.dumps(message)
        await channel.send({"t": "record", "data": data})
        frame = await asyncio.wait_for(channel.recv(), 20)
        assert frame is not None and frame["t"] == "output" and frame.get("answers"), frame
        await channel.send({"t": "written", "seq": frame["seq"]})
        decoded: dict[str, object] = orjson.loads(frame["data"])
        return decoded

    def code(reply: dict[str, object]) -> object:
        error = reply["error"]
        assert isinstance(error, dict), reply
        return error["code"]

    long_id = "i" * 200
    deep: dict[str, object] = {}
    for _ in range(MAX_JSON_DEPTH + 8):
        deep = {"a": deep}
    try:
        init = envelope.request("init", "initialize", {"supported_protocol_versions": [1]})
        assert (await answer(init))["error"] is None
        # Far past the v1 record bound, well within a v2 frame: what a shim would discard.
        big = await answer(b" " * (4 * MAX_RECORD_BYTES) + orjson.dumps(init))
        assert big["request_id"] is None and code(big) == "record_too_large"
        too_long = await answer(envelope.request(long_id, "status"))
        assert too_long["request_id"] is None and code(too_long) == "limit_exceeded"
        session = await answer(envelope.request("open", "session.open", {}, long_id))
        assert session["request_id"] == "open" and code(session) == "limit_exceeded"
        cancel = await answer(envelope.request("cancel", "turn.cancel", {"turn_id": long_id}))
        assert code(cancel) == "limit_exceeded"
        nested = await answer(envelope.request("deep", "status", deep))
        assert nested["request_id"] == "deep" and code(nested) == "limit_exceeded"
        assert (await answer(envelope.request("after", "status")))["error"] is None
        await channel.send({"t": "eof"})
        end = await asyncio.wait_for(channel.recv(), 20)
        assert end == {"t": "end", "status": "ok", "detail": None}
    finally:
        await channel.close()
    assert alive(pid) and status(home)["pid"] == pid
