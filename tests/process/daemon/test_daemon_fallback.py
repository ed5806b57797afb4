"""No daemon can serve: the default mode serves in-process, ``daemon`` mode says why (#37).

Three ways a frontend's service finds no usable daemon: its runtime directory is a file
(a sandbox's container path, a stale mount), the daemon it starts refuses to start (the
socket path holds something that is not a socket), and the daemon does not answer within
the liveness bound (stopped with SIGSTOP). In the default mode (no ``MC_SERVICE_MODE``)
the service answers everything the frontend sent from the start, runs a turn against the
loopback provider, says so in exactly one stderr line without paths and in one
``daemon.log`` line; with ``MC_SERVICE_MODE=daemon`` it writes nothing on stdout and
exits 1 with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.endpoint.lock import is_held
from magi_code.endpoint.paths import runtime_paths
from magi_code.protocol import envelope
from tests.process.daemon.support import cli, context, paths, status
from tests.process.turn_support import check_turn, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess, service_env, spawn

# What the default mode says on stderr, and what ``MC_SERVICE_MODE=daemon`` says instead.
CASES = {
    "runtime_dir": ("its runtime directory is unusable", "is not a directory we can open"),
    "start_failed": ("it could not be started", "the daemon could not start"),
    "no_answer": ("it does not answer", "did not answer the handshake within 3 s"),
}
INITIALIZE = {"supported_protocol_versions": [1]}


@pytest.fixture
def unusable(request: pytest.FixtureRequest, home: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """(reason code, the service's extra environment) for a home no daemon can serve."""
    case: str = request.param
    runtime = Path(tempfile.mkdtemp(prefix="mc-fb-", dir="/tmp"))  # short: socket paths
    stopped: int | None = None
    try:
        if case == "runtime_dir":
            target = runtime / "file"
            target.touch()
            env = {"MC_RUNTIME_DIR": str(target)}
        elif case == "start_failed":
            env = {"MC_RUNTIME_DIR": str(runtime)}
            runtime_paths(context(home, home, env)).socket.mkdir()
        else:
            env = {}
            assert cli(home, "daemon", "start").returncode == 0
            stopped = status(home)["pid"]
            assert isinstance(stopped, int)
            os.kill(stopped, signal.SIGSTOP)
        yield case, env
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)  # then the daemon conftest stops it
        shutil.rmtree(runtime, ignore_errors=True)


async def start(home: Path, project: Path, env: dict[str, str], mode: str | None) -> ServiceProcess:
    """The real ``magi-code --app service``; ``mode`` None: no ``MC_SERVICE_MODE`` at all."""
    full = service_env(home, env)
    del full["MC_SERVICE_MODE"]
    if mode is not None:
        full["MC_SERVICE_MODE"] = mode
    proc = await spawn(project, full)
    # Not "daemon": its stop would wait for a stopped daemon; the conftest stops daemons.
    return ServiceProcess(proc, home, mode or "default")


def fallback_lines(home: Path) -> list[str]:
    log = paths(home).log
    text = log.read_text() if log.exists() else ""
    return [line for line in text.splitlines() if "serving in-process" in line]


@pytest.mark.parametrize(
    ("unusable", "mode"),
    [*((case, None) for case in sorted(CASES)), ("runtime_dir", "auto")],
    indirect=["unusable"],
    ids=[*sorted(CASES), "runtime_dir-auto"],
)
async def test_the_default_mode_serves_in_process_and_says_so_once(
    home: Path,
    project: Path,
    fake: FakeProviderServer,
    unusable: tuple[str, dict[str, str]],
    mode: str | None,
) -> None:
    reason, env = unusable
    write_settings(home, fake)
    fake.enqueue(Reply(text=["Hel", "lo"]))
    svc = await start(home, project, env, mode)
    try:
        # Written at once, before the service has found out that no daemon can serve it:
        # nothing the frontend sent meanwhile is lost.
        await svc.send(envelope.request("init", "initialize", INITIALIZE))
        await svc.send(envelope.request("st", "status", {}))
        await svc.send(envelope.request("turn", "turn.start", {"prompt": "hi", "options": {}}))
        init = await svc.response_for("init", timeout=60)
        assert init["error"] is None, init
        assert (await svc.response_for("st"))["error"] is None
        accepted = await svc.response_for("turn")
        assert accepted["error"] is None, accepted
        events = await svc.events_until_terminal("turn")
        turn = check_turn(events, accepted["payload"]["turn_id"], accepted["session_id"])
        assert turn.terminal["status"] == "completed" and turn.text == "Hello", turn.terminal
        await svc.close_stdin()
        assert await svc.drain_stdout() == []
        assert await svc.wait() == 0
        stderr = await svc.stderr_text()
    finally:
        await svc.stop()
    words = CASES[reason][0]
    assert stderr.splitlines() == [
        f"magi-code: cannot use the daemon ({words}); serving in this process instead "
        "(`magi-code daemon start` says why)"
    ], stderr
    lines = fallback_lines(home)
    assert len(lines) == 1 and lines[0].endswith(
        f"WARNING magi_code.shim: serving in-process reason={reason}"
    ), lines
    if reason != "no_answer":
        assert not is_held(paths(home).lock)  # no daemon was left running


@pytest.mark.parametrize("unusable", ["runtime_dir", "start_failed"], indirect=True)
async def test_daemon_mode_fails_with_the_reason(
    home: Path, project: Path, unusable: tuple[str, dict[str, str]]
) -> None:
    """(A daemon that does not answer: ``test_daemon_upgrade``, stopped daemon.)"""
    reason, env = unusable
    svc = await start(home, project, env, "daemon")
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it may be gone
            await svc.send(envelope.request("init", "initialize", INITIALIZE))
        assert await svc.wait(timeout=60) == 1
        assert await svc.drain_stdout() == []
        stderr = await svc.stderr_text()
    finally:
        await svc.stop()
    [line] = stderr.splitlines()
    assert line.startswith("magi-code: cannot reach the daemon: ") and CASES[reason][1] in line
    assert fallback_lines(home) == []
