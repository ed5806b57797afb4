"""Upgrades without surprises: build identity, replacing an idle daemon, upgrade_pending,
``daemon restart``, fast liveness, and a daemon that loads no product code after start-up.

"Another installed copy" is the package's files copied beside a ``dist-info`` of another
version, first on ``PYTHONPATH``: its CLI, shim and the daemons it starts run those files,
exactly as a second venv or a ``pipx upgrade`` would (without installing dependencies).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import magi_code
from magi_code.client import Channel, socket_for
from magi_code.version import build_id, package_version
from tests.process.daemon.support import alive, cli, context, exited, paths, status, wait_for
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.service import ServiceProcess
from tests.support.v2peer import Peer

OTHER_VERSION = "0.2.0"


@pytest.fixture
def other_copy(tmp_path: Path) -> Path:
    """A second installed copy of the package, version 0.2.0 (a directory for PYTHONPATH)."""
    root = tmp_path / "other-install"
    shutil.copytree(
        Path(magi_code.__file__).parent,
        root / "magi_code",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    dist = root / f"magi_code-{OTHER_VERSION}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: magi-code\nVersion: {OTHER_VERSION}\n"
    )
    return root


def _other(copy: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(copy)}


def _other_build(copy: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from magi_code.version import build_id; print(build_id())"],
        env={**os.environ, **_other(copy)},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


async def _initialize(svc: ServiceProcess) -> dict[str, object]:
    response = await svc.initialize()
    assert response["error"] is None, response
    payload: dict[str, object] = response["payload"]
    return payload


async def test_the_build_is_reported_in_welcome_status_and_daemon_status(home: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    seen = status(home)
    assert seen["build_id"] == build_id() and seen["build_id"].startswith(package_version() + "+")
    assert seen["upgrade_pending"] is False
    channel = await Channel.open(socket_for(context(home, home)), "control", None)
    try:
        assert channel.welcome["build_id"] == build_id()
    finally:
        await channel.close()
    text = cli(home, "daemon", "status")
    assert f"build:   {build_id()}" in text.stdout and "another build" not in text.stdout


async def test_a_client_of_another_build_replaces_an_idle_daemon(
    home: Path, project: Path, other_copy: Path
) -> None:
    other_build = _other_build(other_copy)
    assert other_build != build_id() and other_build.startswith(OTHER_VERSION + "+")
    assert cli(home, "daemon", "start").returncode == 0
    old_pid = status(home)["pid"]
    svc = await ServiceProcess.start(home, project, _other(other_copy))
    try:
        init = await _initialize(svc)
        assert init["server_version"] == OTHER_VERSION
        now = status(home)
        assert now["pid"] != old_pid and now["build_id"] == other_build
        assert now["version"] == OTHER_VERSION
        await exited(old_pid)
        # Seen from the first install, the running daemon is another build.
        text = cli(home, "daemon", "status")
        assert text.returncode == 0 and "another build" in text.stdout
    finally:
        await svc.close_stdin()
        assert await svc.wait() == 0


async def test_a_busy_daemon_is_marked_upgrade_pending_and_exits_when_its_turn_ends(
    home: Path, project: Path, other_copy: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    hold = threading.Event()  # the turn runs until the test releases it
    fake.enqueue(Reply(text=[f"part {i} " for i in range(12)], hold=hold))
    owner = await _persistent_peer(home, project)
    started = await owner.request("turn.start", {"prompt": "slow"})
    assert started["error"] is None, started
    turn_id = started["payload"]["turn_id"]
    await owner.until(lambda f: f["t"] == "message" and f["message"]["event"] != "turn.started")
    await owner.close()  # the turn runs on, detached
    old = status(home)
    assert old["active_turns"] == 1 and old["build_id"] == build_id()
    svc = await ServiceProcess.start(home, project, _other(other_copy))
    try:
        init = await _initialize(svc)
        # The installed package's version, although the daemon serving it is older.
        assert init["server_version"] == OTHER_VERSION
        marked = status(home)
        assert marked["pid"] == old["pid"] and marked["version"] == package_version()
        assert marked["upgrade_pending"] is True
        assert "upgrade pending" in cli(home, "daemon", "status").stdout
    finally:
        await svc.close_stdin()
        assert await svc.wait() == 0
    assert alive(old["pid"]), "the daemon must let its turn finish"
    assert status(home)["active_turns"] == 1
    hold.set()
    await exited(old["pid"], 60)
    # The next client gets its own build, and the turn's outcome survived the exchange.
    peer = await _persistent_peer(home, project)
    try:
        assert peer.channel.welcome["build_id"] == build_id()
        session_id = started["payload"]["session_id"]
        answer, events = await peer.attach(turn_id, -1, session_id=session_id)
        assert answer["status"] == "finished"
        assert events[-1]["payload"]["status"] == "completed"
    finally:
        await peer.close()


async def _persistent_channel(home: Path, project: Path) -> Channel:
    from magi_code.client import connect_channel

    return await connect_channel(context(home, project), "persistent", autostart=True)


async def _persistent_peer(home: Path, project: Path) -> Peer:
    return await Peer.over(await _persistent_channel(home, project))


async def test_daemon_restart_of_an_idle_daemon_starts_a_new_one(home: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    old_pid = status(home)["pid"]
    done = cli(home, "daemon", "restart")
    assert done.returncode == 0, done
    new = status(home)
    assert new["running"] is True and new["pid"] != old_pid
    assert f"restarted (pid {new['pid']})" in done.stdout
    await exited(old_pid)


async def test_daemon_restart_not_running_starts_one(home: Path) -> None:
    done = cli(home, "daemon", "restart")
    assert done.returncode == 0, done
    assert status(home)["running"] is True


async def test_daemon_restart_lets_a_running_turn_finish_first(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    hold = threading.Event()  # the turn runs until the test releases it
    fake.enqueue(Reply(text=[f"part {i} " for i in range(10)], hold=hold))
    peer = await _persistent_peer(home, project)
    old_pid = status(home)["pid"]
    started = await peer.request("turn.start", {"prompt": "slow"})
    turn_id = started["payload"]["turn_id"]
    restart = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magi_code",
        "daemon",
        "restart",
        env=context(home, project).env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(lambda: status(home).get("restart_pending") is True, 30, "restart_pending")
        assert status(home)["active_turns"] == 1
        hold.set()
        events = await peer.turn_events(turn_id)
        terminal = events[-1]["payload"]
        assert terminal["status"] == "completed", terminal  # not cancelled by the restart
        out, err = await asyncio.wait_for(restart.communicate(), 90)
        assert restart.returncode == 0, err
        assert b"waiting for 1 running turn(s)" in out
    finally:
        if restart.returncode is None:
            restart.kill()
            await restart.wait()
        await peer.close()
    new = status(home)
    assert new["running"] is True and new["pid"] != old_pid
    await exited(old_pid)


async def test_the_daemon_loads_no_product_module_after_it_is_ready(
    home: Path, project: Path, other_copy: Path, fake: FakeProviderServer
) -> None:
    """The files of a running daemon's install vanish (an upgrade in progress): it still
    serves turns with tools, configuration and sessions, because it imported all of it."""
    write_settings(home, fake)
    assert cli(home, "daemon", "start", extra=_other(other_copy)).returncode == 0
    assert status(home)["version"] == OTHER_VERSION
    shutil.rmtree(other_copy / "magi_code")
    fake.enqueue(
        Reply(
            text=[], tool_calls=[FakeToolCall("c1", "shell", '{"command": "echo hi > out.txt"}')]
        ),
        Reply(text=["done"]),
    )
    # No build_id in this hello: a client that does not ask the daemon to make way.
    ctx = context(home, project)
    peer = await Peer.over(await Channel.open(socket_for(ctx), "persistent", ctx))
    try:
        started = await peer.request("turn.start", {"prompt": "use the shell"})
        assert started["error"] is None, started
        events = await peer.turn_events(started["payload"]["turn_id"])
        assert events[-1]["payload"]["status"] == "completed", events[-1]
        assert (project / "out.txt").read_text() == "hi\n"
        for method in ("config.get", "catalog.providers", "session.list", "status"):
            answer = await peer.request(method, {})
            assert answer["error"] is None, (method, answer)
    finally:
        await peer.close()


@pytest.mark.parametrize("how", ["daemon run", "on demand"])
def test_an_install_that_cannot_be_imported_is_a_start_up_error(
    home: Path, other_copy: Path, how: str
) -> None:
    """A half-replaced install: a module that neither the CLI nor the daemon's own start
    imports (the coordinator's) does not compile. The daemon says so and exits 2."""
    (other_copy / "magi_code" / "core" / "persistent.py").write_text("def half(:\n")
    if how == "daemon run":
        done = cli(home, "daemon", "run", extra=_other(other_copy))
        assert done.returncode == 2, done
        assert "magi-code: cannot load the installed magi-code package (SyntaxError)" in (
            done.stderr
        )
    else:
        done = cli(home, "daemon", "start", extra=_other(other_copy))
        assert done.returncode == 1, done
        assert (
            "cannot start the daemon: cannot load the installed magi-code package (SyntaxError)"
            in done.stderr
        )
    assert "Traceback" not in done.stderr
    assert status(home)["running"] is False
    assert not paths(home).socket.exists()


async def test_a_stopped_daemon_is_reported_by_the_shim_within_its_answer_bound(
    home: Path, project: Path
) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    pid = status(home)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        # The bound is 3 s unless the shim's environment shortens it.
        svc = await ServiceProcess.start(home, project, {"MC_DAEMON_ANSWER_TIMEOUT_SECONDS": "1"})
        code = await svc.wait(timeout=30)
        elapsed = time.monotonic() - started
        stderr = await svc.stderr_text()
        assert code == 1, stderr
        assert "cannot reach the daemon" in stderr and "within 1 s" in stderr
        # Interpreter start-up plus the 1 s bound; generous for a loaded machine.
        assert elapsed < 12, elapsed
    finally:
        os.kill(pid, signal.SIGCONT)
    assert paths(home).lock.exists()
