"""Whose daemon is this? Homes sharing a runtime dir, lost sockets, silent and foreign peers.

Every defect here was reproduced against the code before its fix (issue #12, items 3, 6, 8):
one home's commands acted on another home's daemon, a deleted socket cancelled every turn,
a stopped daemon made ``daemon stop`` wait 150 s, commands printed tracebacks, ``status``
called another user's socket "not running", and odd hello paths were internal errors.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.client import Client, DaemonError
from magi_code.endpoint.paths import runtime_paths
from magi_code.protocol.frames import FrameDecoder, encode_frame
from tests.process.daemon.support import alive, cli, context, paths, persistent, status, wait_for
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import service_env, stop_daemons

# The clients' bound on a daemon that accepts but does not answer (3 s by default): the
# tests that wait it out against a stopped daemon shorten it.
SHORT_ANSWER: Mapping[str, str] = {"MC_DAEMON_ANSWER_TIMEOUT_SECONDS": "1"}

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


@pytest.fixture
def shared_runtime_dir(tmp_path: Path) -> Iterator[Path]:
    """One short private MC_RUNTIME_DIR (pytest's tmp_path can be too long for a socket)."""
    path = Path(tempfile.mkdtemp(prefix="mc-rt-", dir="/tmp"))
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        # Daemons first: one whose socket directory vanished re-creates it to re-bind.
        stop_daemons(tmp_path)
        shutil.rmtree(path, ignore_errors=True)


def _home(tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    home.mkdir()
    return home


def _one_line_or_success(result: subprocess.CompletedProcess[str], command: str = "") -> None:
    """No traceback ever; a failure is exactly one ``magi-code: ...`` line on stderr.

    ``status`` answers on stdout ("not running", exit 3; "not running: <why>", exit 1),
    and a foreground ``run`` also shows its own log lines on stderr (the journal under
    systemd), each ``magi-code: ``.
    """
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if command == "run":
        assert all(line.startswith("magi-code: ") for line in lines), result.stderr
    elif command == "status" and result.returncode in (1, 3):
        assert not lines and result.stdout.startswith("magi-code daemon not running"), result
        assert len(result.stdout.strip().splitlines()) == 1, result
    elif result.returncode != 0:
        assert len(lines) == 1 and lines[0].startswith("magi-code: "), result.stderr


# -- raw v2 frames ---------------------------------------------------------------------------


def _hello(role: str, launch: Mapping[str, Any] | None) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "t": "hello",
        "protocol_versions": [2],
        "client_name": "identity-test",
        "client_version": "0",
        "role": role,
    }
    if launch is not None:
        frame["launch"] = dict(launch)
    return frame


def _answer(sock_path: Path, frame: Mapping[str, Any]) -> dict[str, Any]:
    """Send one frame on a fresh connection and return the daemon's first frame."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(str(sock_path))
        sock.sendall(encode_frame(frame))
        decoder = FrameDecoder()
        while True:
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection without answering"
            frames = decoder.feed(chunk)
            if frames:
                return frames[0]


# -- item 1: two homes sharing one MC_RUNTIME_DIR --------------------------------------------


async def test_homes_sharing_a_runtime_dir_never_touch_each_others_daemon(
    tmp_path: Path, project: Path, fake: FakeProviderServer, shared_runtime_dir: Path
) -> None:
    shared = {"MC_RUNTIME_DIR": str(shared_runtime_dir)}
    home_a, home_b = _home(tmp_path, "mc-home-a"), _home(tmp_path, "mc-home-b")
    write_settings(home_a, fake)
    fake.enqueue(Reply(text=["partial"], ending="stall", after_chunks=1))
    client = await persistent(home_a, project, **shared)
    try:
        reply = await client.request("turn.start", {"prompt": "hang"})
        assert reply["error"] is None, reply
        await wait_for(lambda: len(fake.requests) == 1, what="A's provider request")
        a = status(home_a)
        sock_a = Path(a["socket"])
        assert sock_a.parent == shared_runtime_dir and a["active_turns"] == 1
        inode_a = os.stat(sock_a).st_ino

        # B's commands see no daemon of B's, and leave A's alone.
        b_status = orjson.loads(cli(home_b, "daemon", "status", "--json", extra=shared).stdout)
        assert b_status["running"] is False and b_status["pid"] is None
        assert Path(b_status["socket"]) != sock_a
        assert Path(b_status["socket"]).parent == shared_runtime_dir
        b_stop = cli(home_b, "daemon", "stop", extra=shared)
        assert b_stop.returncode == 0 and "not running" in b_stop.stdout, b_stop.stderr
        # B's foreground daemon binds its own socket next to A's and removes nothing.
        b_run = subprocess.Popen(
            [sys.executable, "-m", "magi_code", "daemon", "run"],
            env=service_env(home_b, shared),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            await wait_for(lambda: "mc_home" in status(home_b), what="B's daemon")
            b = status(home_b)
            assert b["pid"] == b_run.pid and b["pid"] != a["pid"]
            assert b["mc_home"] == str(home_b.resolve())
            assert Path(b["socket"]) != sock_a
            assert cli(home_b, "daemon", "stop", extra=shared).returncode == 0
            assert await asyncio.to_thread(b_run.wait, 30) == 0
        finally:
            if b_run.poll() is None:
                b_run.kill()
                b_run.wait()

        after = status(home_a)
        assert after["pid"] == a["pid"] and after["instance_id"] == a["instance_id"]
        assert after["active_turns"] == 1, "B's commands cancelled A's turn"
        assert after["mc_home"] == str(home_a.resolve())
        assert os.stat(sock_a).st_ino == inode_a, "B's commands replaced A's socket"
        assert (await client.status())["active_turns"] == 1  # A's client is still served
    finally:
        await client.close()


async def test_a_control_hello_states_its_home_and_another_home_is_refused(
    tmp_path: Path, shared_runtime_dir: Path
) -> None:
    home_a, home_b = _home(tmp_path, "mc-home-a"), _home(tmp_path, "mc-home-b")
    assert cli(home_a, "daemon", "start").returncode == 0
    sock_a = Path(status(home_a)["socket"])
    wrong = _answer(sock_a, _hello("control", {"mc_home": str(home_b)}))
    assert wrong["t"] == "refused" and wrong["code"] == "wrong_home", wrong
    alias = tmp_path / "alias-a"
    alias.symlink_to(home_a)
    right = _answer(sock_a, _hello("control", {"mc_home": str(alias)}))
    assert right["t"] == "welcome" and right["role"] == "control", right
    legacy = _answer(sock_a, _hello("control", None))  # a client that predates the field
    assert legacy["t"] == "welcome", legacy
    # Even a socket path that leads to A's daemon does not let B's clients act on it:
    # their hello names home B.
    shared = {"MC_RUNTIME_DIR": str(shared_runtime_dir)}
    ctx_b = context(home_b, home_b, shared)
    os.symlink(sock_a, runtime_paths(ctx_b).socket)
    for command in ("stop", "status"):
        result = cli(home_b, "daemon", command, extra=shared)
        assert result.returncode == 1, (command, result)
        assert "wrong_home" in result.stderr + result.stdout, (command, result)
        _one_line_or_success(result, command)
    with pytest.raises(DaemonError) as refused:
        await Client.connect(ctx_b, "control", autostart=False)
    assert refused.value.code == "wrong_home"
    assert status(home_a)["running"] is True


# -- item 6: odd hello paths are invalid_hello over the real socket --------------------------
# Each case is a fresh connection to one daemon: a refused hello must leave it serving the
# next, which the later cases and the final status check.

BAD_HOMES = ("{home}\x00/x", "relative/home", "", 7, None)
ODD_HOMES = ("/nonexistent/../tmp", "//", "/" + "d/" * 1500, "/tmp/\u00e9\u6f22/home")


def test_a_bad_home_in_hello_is_refused_as_invalid_hello(home: Path, tmp_path: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    sock_path = Path(status(home)["socket"])
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    loop = str(tmp_path / "loop-a" / "home")
    for role in ("control", "persistent", "v1_shim"):
        for mc_home in BAD_HOMES:
            value = mc_home.format(home=home) if isinstance(mc_home, str) else mc_home
            launch = {"mc_home": value, "project_dir": str(home), "env": {}}
            answer = _answer(sock_path, _hello(role, launch))
            assert answer == {
                "t": "refused",
                "code": "invalid_hello",
                "message": "the hello frame is invalid",
            }, (role, mc_home)
        # A home in a symlink loop is invalid too, not an internal error.
        launch = {"mc_home": loop, "project_dir": str(home), "env": {}}
        answer = _answer(sock_path, _hello(role, launch))
        assert answer.get("code") == "invalid_hello", (role, answer)
    assert status(home)["running"] is True


def test_other_odd_homes_are_answered_wrong_home(home: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    sock_path = Path(status(home)["socket"])
    for mc_home in ODD_HOMES:
        launch = {"mc_home": mc_home, "project_dir": str(home), "env": {}}
        answer = _answer(sock_path, _hello("persistent", launch))
        assert answer.get("code") == "wrong_home", (mc_home, answer)
    assert status(home)["running"] is True


# -- item 2: a deleted or replaced socket file ------------------------------------------------


async def test_a_deleted_socket_is_rebound_at_once_and_the_turn_keeps_running(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    chunks = [f"c{i} " for i in range(20)]
    hold = threading.Event()  # the turn runs until the test releases it
    fake.enqueue(Reply(text=chunks, hold=hold))
    client = await persistent(home, project)
    try:
        reply = await client.request("turn.start", {"prompt": "go"})
        assert reply["error"] is None, reply
        turn_id = reply["payload"]["turn_id"]
        before = status(home)
        sock_path = Path(before["socket"])
        old_inode = os.stat(sock_path).st_ino
        os.unlink(sock_path)
        await wait_for(sock_path.exists, timeout=10, what="the socket to be re-bound")
        assert os.stat(sock_path).st_ino != old_inode
        assert os.stat(sock_path).st_mode & 0o777 == 0o600
        again = status(home)
        assert again["pid"] == before["pid"] and again["instance_id"] == before["instance_id"]
        assert again["active_turns"] == 1 and again["accepting"] is True
        hold.set()
        events = []
        async for event in client.events():
            events.append(event)
            if event["event"] == "turn.terminal":
                break
        terminal = events[-1]["payload"]
        assert terminal["turn_id"] == turn_id and terminal["status"] == "completed"
        assert terminal["assistant_text"] == "".join(chunks)
    finally:
        await client.close()
    assert "socket re-bound" in paths(home).log.read_text()
    info = orjson.loads(paths(home).info.read_bytes())
    assert info["pid"] == before["pid"] and info["socket"] == str(sock_path)


async def test_a_socket_taken_by_another_listener_is_never_unlinked(
    home: Path, project: Path
) -> None:
    client = await persistent(home, project)
    try:
        before = status(home)
        sock_path = Path(before["socket"])
        os.unlink(sock_path)
        intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        intruder.bind(str(sock_path))
        intruder.listen(4)
        intruder_inode = os.stat(sock_path).st_ino
        try:
            await wait_for(
                lambda: "not re-bound" in paths(home).log.read_text(),
                timeout=5,
                what="the daemon to notice the intruder",
            )
            # From outside, the lock holder does not answer on its path: say so, quickly.
            started = time.monotonic()
            seen = orjson.loads(cli(home, "daemon", "status", "--json", extra=SHORT_ANSWER).stdout)
            assert time.monotonic() - started < 15
            assert seen["running"] is True and seen["responding"] is False
            assert seen["pid"] == before["pid"]
            # That wait (the answer bound, 1 s, after the interpreter's start) spans more of
            # the daemon's checks (one a second): none of them unlinked the intruder's socket.
            assert os.stat(sock_path).st_ino == intruder_inode
            # The daemon keeps serving its open connections and says it is not accepting.
            served = await client.status()
            assert served["pid"] == before["pid"] and served["accepting"] is False
        finally:
            intruder.close()
        os.unlink(sock_path)  # the intruder's owner cleans up; the daemon re-binds
        await wait_for(lambda: status(home).get("accepting") is True, what="the re-bind")
        assert status(home)["pid"] == before["pid"]
    finally:
        await client.close()


# -- item 3: a daemon that accepts but does not answer ---------------------------------------


def test_stop_and_status_of_a_stopped_daemon_report_it_promptly_and_touch_nothing(
    home: Path,
) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    info = status(home)
    pid, sock_path = info["pid"], Path(info["socket"])
    inode = os.stat(sock_path).st_ino
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        stopped = cli(home, "daemon", "stop", extra=SHORT_ANSWER)
        assert time.monotonic() - started < 15, "daemon stop waited far too long"
        assert stopped.returncode == 1, stopped
        _one_line_or_success(stopped)
        assert "did not answer" in stopped.stderr and str(pid) in stopped.stderr
        started = time.monotonic()
        seen = orjson.loads(cli(home, "daemon", "status", "--json", extra=SHORT_ANSWER).stdout)
        assert time.monotonic() - started < 15
        assert seen["running"] is True and seen["responding"] is False
        assert "did not answer" in seen["error"]
        text = cli(home, "daemon", "status", extra=SHORT_ANSWER)
        assert text.returncode == 4 and "not answering" in text.stdout  # distinct from 3
        started_again = cli(home, "daemon", "start", extra=SHORT_ANSWER)
        assert started_again.returncode == 1, started_again
        _one_line_or_success(started_again)
        assert alive(pid)
        assert os.stat(sock_path).st_ino == inode
    finally:
        os.kill(pid, signal.SIGCONT)
    assert cli(home, "daemon", "stop").returncode == 0
    assert not alive(pid) or status(home)["running"] is False


# -- item 4: one-line errors, never tracebacks -----------------------------------------------


def _set_read_only(path: Path, read_only: bool) -> None:
    """Root ignores modes: make ``path`` immutable instead (``chattr +i``, ext2/3/4, xfs)."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555 if read_only else 0o755)
        return
    flag = "+i" if read_only else "-i"
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    if done.returncode != 0 and read_only:
        pytest.skip("as root a read-only directory needs chattr +i, unavailable here")


@pytest.fixture
def read_only_paths(tmp_path: Path) -> Iterator[list[Path]]:
    """Directories a test made read-only; made writable again at teardown."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            _set_read_only(path, False)


def _run_cli(home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magi_code", *args],
        env=service_env(home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd="/",
    )


@pytest.mark.parametrize("layout", ["home_read_only", "run_dir_read_only"])
def test_a_read_only_home_gives_one_line_errors_in_daemon_mode(
    tmp_path: Path, read_only_paths: list[Path], layout: str
) -> None:
    home = _home(tmp_path, "ro-home")
    target = home
    if layout == "run_dir_read_only":
        target = home / "run"
        target.mkdir(mode=0o700)
    _set_read_only(target, True)
    read_only_paths.append(target)
    init = orjson.dumps(
        {
            "protocol_version": 1,
            "kind": "request",
            "request_id": "init-1",
            "method": "initialize",
            "payload": {"supported_protocol_versions": [1]},
        }
    ).decode()
    service = _run_cli(home, "--app", "service", stdin=init + "\n")
    assert service.returncode == 1, service
    _one_line_or_success(service)
    assert "cannot" in service.stderr, service.stderr
    for command in ("start", "run", "stop", "status"):
        result = _run_cli(home, "daemon", command)
        _one_line_or_success(result, command)
        if command in ("start", "run"):
            assert result.returncode == 2, (command, result)
            assert "cannot" in result.stderr, (command, result.stderr)
        else:
            assert "not running" in result.stdout, (command, result)


def test_racing_starts_and_stops_never_print_a_traceback(home: Path) -> None:
    commands = ["start", "stop"] * 12

    def run(command: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        return command, cli(home, "daemon", command)

    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(run, commands))
    for command, result in results:
        _one_line_or_success(result, command)
        if result.returncode == 0 and command == "start":
            assert "pid None" not in result.stdout, result.stdout
    final = cli(home, "daemon", "stop")
    assert final.returncode == 0, final.stderr
    assert status(home)["running"] is False


# -- item 5: a socket served by another user --------------------------------------------------


FOREIGN_LISTENER = """
import os, socket, sys, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(sys.argv[1])
os.setgid(65534)
os.setuid(65534)
sock.listen(8)  # SO_PEERCRED reports the credentials at listen()
print("listening", flush=True)
time.sleep(120)
"""


@root_only
def test_status_says_when_another_user_serves_the_socket(home: Path) -> None:
    p = paths(home)
    p.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    p.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    listener = subprocess.Popen(
        [sys.executable, "-c", FOREIGN_LISTENER, str(p.socket)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
        inode = os.stat(p.socket).st_ino
        seen = cli(home, "daemon", "status", "--json")
        assert seen.returncode == 0
        doc = orjson.loads(seen.stdout)
        assert doc["running"] is False
        assert doc["error"] == "the socket is served by another user"
        text = cli(home, "daemon", "status")
        assert text.returncode == 1
        assert "served by another user" in text.stdout
        for command in ("stop", "start", "run"):
            result = cli(home, "daemon", command)
            assert result.returncode != 0, (command, result)
            _one_line_or_success(result, command)
            assert "another" in result.stderr, (command, result.stderr)
        assert os.stat(p.socket).st_ino == inode, "a command removed another user's socket"
        assert listener.poll() is None
    finally:
        listener.kill()
        listener.wait()
