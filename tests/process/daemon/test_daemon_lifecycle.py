"""The daemon as real processes on real sockets: start races, crashes, stale sockets, peers."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from magi_code.client import Client, DaemonUnavailable
from magi_code.endpoint.lock import is_held
from magi_code.endpoint.paths import home_hash, runtime_paths
from tests.process.daemon.support import alive, cli, context, paths, status, wait_for
from tests.support.service import ServiceProcess, stop_daemon


def test_five_concurrent_starts_make_exactly_one_daemon(home: Path) -> None:
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(lambda _: cli(home, "daemon", "start"), range(5)))
    assert [r.returncode for r in results] == [0] * 5, [r.stderr for r in results]
    pids = {r.stdout.split("pid ")[1].rstrip(")\n") for r in results}
    assert len(pids) == 1
    info = status(home)
    assert info["running"] is True
    assert str(info["pid"]) in pids
    assert info["protocol_versions"] == [2]
    assert info["socket"] and info["version"]
    log = paths(home).log.read_text()
    assert log.count("listening instance=") == 1
    assert cli(home, "daemon", "stop").returncode == 0
    assert status(home)["running"] is False
    assert cli(home, "daemon", "status").returncode == 3


def test_runtime_files_are_private(home: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    p = paths(home)
    for path, mode in ((p.state_dir, 0o700), (p.socket_dir, 0o700), (p.socket, 0o600)):
        assert os.stat(path).st_mode & 0o777 == mode, path
    for path in (p.lock, p.info, p.log):
        assert os.stat(path).st_mode & 0o077 == 0, path


def test_an_exiting_daemon_removes_its_own_socket_directory_and_no_shared_one(
    home: Path, request: pytest.FixtureRequest
) -> None:
    # Under /tmp: the socket path must fit in 100 bytes.
    xdg, shared = (Path(tempfile.mkdtemp(prefix=p, dir="/tmp")) for p in ("mc-xdg-", "mc-rt-"))
    for base in (xdg, shared):
        request.addfinalizer(lambda base=base: shutil.rmtree(base, ignore_errors=True))
    request.addfinalizer(lambda: stop_daemon(home))  # runs first
    own_dir = xdg / "magi-code" / home_hash(home)
    for extra, socket_dir in (
        ({"XDG_RUNTIME_DIR": str(xdg)}, own_dir),
        ({"MC_RUNTIME_DIR": str(shared)}, shared),
    ):
        assert cli(home, "daemon", "start", extra=extra).returncode == 0
        answer = cli(home, "daemon", "status", "--json", extra=extra)
        sock = Path(orjson.loads(answer.stdout)["socket"])
        assert sock.parent == socket_dir and sock.exists()
        assert cli(home, "daemon", "stop", extra=extra).returncode == 0
        assert not sock.exists()
    # The hash-named directory was this home's alone; its parent and the shared directory,
    # empty now, are not the daemon's to remove, nor is the state directory.
    assert not own_dir.exists()
    assert list((xdg / "magi-code").iterdir()) == []
    assert shared.is_dir() and list(shared.iterdir()) == []
    assert paths(home).lock.exists()


def _lock_inode(home: Path) -> int:
    return os.stat(paths(home).lock).st_ino


async def test_kill_9_then_start_recovers_with_same_lock_inode_and_history(
    home: Path, project: Path
) -> None:
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        created = await svc.request("session.create")
        session_id = created["payload"]["session_id"]
    finally:
        await svc.close_stdin()
        await svc.wait()
    before = status(home)
    inode = _lock_inode(home)
    os.kill(before["pid"], signal.SIGKILL)
    await wait_for(lambda: not alive(before["pid"]), what="daemon death")
    assert paths(home).socket.exists()  # left behind by the dead daemon
    assert not is_held(paths(home).lock)
    assert cli(home, "daemon", "start").returncode == 0
    after = status(home)
    assert after["pid"] != before["pid"]
    assert _lock_inode(home) == inode
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        listed = await svc.request("session.list")
        ids = [s["session_id"] for s in listed["payload"]["sessions"]]
        assert session_id in ids
    finally:
        await svc.stop()


async def test_a_starting_daemon_removes_what_crashes_left_among_the_sessions(
    home: Path,
) -> None:
    sessions = home / "sessions"
    removing, staging = sessions / ".rm-ses_cut_short", sessions / ".new-ses_cut_short"
    for leftover in (removing, staging):
        leftover.mkdir(parents=True)
        (leftover / "history.jsonl").write_text("{}\n")
    long_ago = time.time() - 2 * 3600
    os.utime(staging, (long_ago, long_ago))
    assert cli(home, "daemon", "start").returncode == 0
    await wait_for(lambda: not removing.exists() and not staging.exists(), what="the removal")
    # The line follows the removal: wait for it rather than read the log at once.
    said = "removed directories crashes left among the sessions count=2"
    await wait_for(lambda: said in paths(home).log.read_text(), what="the log line")
    log = paths(home).log.read_text()
    assert "ses_cut_short" not in log and str(home) not in log


def test_stale_socket_without_lock_holder_is_replaced(home: Path) -> None:
    p = paths(home)
    p.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(p.socket))
    stale.close()  # a socket file nobody listens on, and no lock holder
    assert cli(home, "daemon", "start").returncode == 0
    assert status(home)["running"] is True


def test_live_daemon_and_socket_are_never_replaced(home: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    first = status(home)
    inode = os.stat(paths(home).socket).st_ino
    # A second foreground daemon must refuse without touching the socket.
    second = cli(home, "daemon", "run")
    assert second.returncode == 3
    assert "already running" in second.stderr
    assert os.stat(paths(home).socket).st_ino == inode
    assert cli(home, "daemon", "start").returncode == 0
    assert status(home)["pid"] == first["pid"]


def test_foreign_listener_holding_the_lock_is_reported_not_touched(home: Path) -> None:
    """A live lock holder that does not answer is never killed or unlinked."""
    p = paths(home)
    p.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o600);"
            "fcntl.flock(fd,fcntl.LOCK_EX);print('locked',flush=True);time.sleep(60)",
            str(p.lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        info = status(home)
        assert info["running"] is True and info["responding"] is False
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
async def test_peer_with_another_uid_is_refused_before_any_byte(
    home: Path, project: Path, request: pytest.FixtureRequest
) -> None:
    # Under /tmp, not tmp_path: pytest's base directory is closed to other users.
    sock_dir = Path(tempfile.mkdtemp(prefix="mc-peer-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(sock_dir, ignore_errors=True))
    request.addfinalizer(lambda: stop_daemon(home))  # runs first: it may re-bind
    ctx = context(home, project, {"MC_RUNTIME_DIR": str(sock_dir)})
    client = await Client.connect(ctx, "control")
    await client.close()
    sock_path = runtime_paths(ctx).socket  # daemon-<hash of MC_HOME>.sock in the shared dir
    # Let uid 65534 reach the socket (the directory check is what normally stops it).
    os.chmod(sock_dir, 0o711)
    os.chmod(sock_path, 0o666)
    script = (
        "import os,socket,struct,sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)\n"
        "body=b'\\x81\\xa1t\\xa5hello'\n"
        "try:\n"
        "    s.sendall(struct.pack('>I',len(body))+body)\n"
        "    data=s.recv(100)\n"
        "except OSError:\n"
        "    data=b''\n"
        "print('EMPTY' if data==b'' else 'DATA')\n"
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, str(sock_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.stdout.strip() == "EMPTY", result.stderr
    os.chmod(sock_dir, 0o700)
    assert "refused a connection from another user" in paths(home).log.read_text()


async def test_client_refuses_a_socket_dir_that_is_not_private(
    home: Path, project: Path, request: pytest.FixtureRequest
) -> None:
    # Under /tmp: the socket name carries the home's hash, tmp_path may be too long for it.
    sock_dir = Path(tempfile.mkdtemp(prefix="mc-open-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(sock_dir, ignore_errors=True))
    os.chmod(sock_dir, 0o777)
    ctx = context(home, project, {"MC_RUNTIME_DIR": str(sock_dir)})
    with pytest.raises(Exception, match="mode"):
        await Client.connect(ctx, "control", autostart=False)


async def test_idle_stop_racing_new_connections_never_loses_a_request(
    home: Path, project: Path
) -> None:
    extra = {"MC_DAEMON_IDLE_SECONDS": "0.3"}
    pids: set[int] = set()
    for round_ in range(6):
        svc = await ServiceProcess.start(home, project, extra)
        try:
            await svc.initialize()
            reply = await svc.request("status")
            assert reply["error"] is None
        finally:
            await svc.close_stdin()
            assert await svc.wait() == 0
        pids.add(status(home)["pid"] or 0)
        # Sleep around the idle deadline so some rounds race the idle stop.
        await asyncio.sleep(0.1 * (round_ % 4))
    with pytest.raises(DaemonUnavailable):
        for _ in range(100):
            await asyncio.sleep(0.1)
            await (await Client.connect(context(home, project), "control", autostart=False)).close()


def test_status_json_reports_a_stopped_daemon_with_exit_zero(home: Path) -> None:
    result = cli(home, "daemon", "status", "--json")
    assert result.returncode == 0
    data = orjson.loads(result.stdout)
    assert data["running"] is False
    assert {"pid", "socket", "version", "protocol_versions"} <= set(data)


def test_install_prints_or_writes_the_user_unit(home: Path, tmp_path: Path) -> None:
    user_home = tmp_path / "installer-home"
    user_home.mkdir()
    # Never the runner's own XDG_CONFIG_HOME: install would write there.
    extra = {"HOME": str(user_home), "XDG_CONFIG_HOME": ""}
    printed = cli(home, "daemon", "install", "--print", extra=extra)
    assert printed.returncode == 0, printed.stderr
    assert "daemon run" in printed.stdout and str(home) in printed.stdout
    assert not any(user_home.rglob("*.service"))
    written = cli(home, "daemon", "install", extra=extra)
    assert written.returncode == 0, written.stderr
    (unit,) = user_home.rglob("magi-code*.service")
    text = unit.read_text()
    assert "ExecStart=" in text and "daemon run" in text and f"MC_HOME={home}" in text
    assert "systemctl --user" in written.stdout + written.stderr
