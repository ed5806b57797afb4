"""stderr carries start-up and I/O diagnostics, never a host path (embedded and daemon
modes): an unusable runtime directory, a daemon that cannot start, and unreadable
settings are each reported without ``MC_HOME``, the project, the socket or a settings
path."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.service import ServiceProcess, running_service, service_env

# Both modes: stderr is written by the embedded service or by the shim.
pytestmark = pytest.mark.both_modes

# Generous bound for an answer; a wedged service never answers at all.
WAIT_S = 60.0


@pytest.fixture
def open_runtime_dir() -> Iterator[Path]:
    """A short MC_RUNTIME_DIR that group and others may write (mode 0777)."""
    path = Path(tempfile.mkdtemp(prefix="mc-rt-", dir="/tmp"))
    os.chmod(path, 0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _run_to_eof(home: Path, project: Path, env: dict[str, str]) -> tuple[int, str]:
    service = await ServiceProcess.start(home, project, env)
    try:
        await service.close_stdin()
        code = await service.wait(WAIT_S)
        return code, await service.stderr_text()
    finally:
        await service.stop()


def _no_paths(stderr: str, *paths: Path) -> None:
    assert "Traceback" not in stderr, stderr
    for path in paths:
        assert str(path) not in stderr, stderr
        assert str(path.resolve()) not in stderr, stderr


async def test_an_unsafe_runtime_directory_is_reported_without_its_path(
    home: Path, project: Path, open_runtime_dir: Path, service_mode: str
) -> None:
    code, stderr = await _run_to_eof(home, project, {"MC_RUNTIME_DIR": str(open_runtime_dir)})
    _no_paths(stderr, open_runtime_dir, home, project)
    if service_mode == "daemon":
        assert code == 1
        assert stderr.splitlines() == [
            "magi-code: cannot reach the daemon: a runtime directory has mode 0777, not 0700; "
            "`magi-code daemon start` shows where"
        ], stderr
    else:
        assert code == 0 and stderr == ""  # embedded mode has no runtime directory


async def test_a_daemon_that_cannot_start_is_reported_without_paths(
    home: Path, project: Path, service_mode: str
) -> None:
    # The daemon's log file cannot be opened (a directory is in its place): the daemon
    # reports "cannot use <path>" to its starter.
    state = home / "run"
    state.mkdir(mode=0o700)
    (state / "daemon.log").mkdir()
    code, stderr = await _run_to_eof(home, project, {})
    _no_paths(stderr, home, project)
    if service_mode == "daemon":
        assert code == 1
        assert stderr.splitlines() == [
            "magi-code: cannot reach the daemon: the daemon could not start; "
            "`magi-code daemon start` shows why"
        ], stderr
    else:
        assert code == 0 and stderr == ""


async def test_unreadable_settings_are_reported_without_their_paths(
    home: Path, project: Path
) -> None:
    (home / "settings.json").mkdir()  # unreadable as a file, whatever the user's rights
    (project / ".magi-code" / "settings.json").mkdir(parents=True)
    async with running_service(home, project) as service:
        config = await service.request("config.get")
        assert config["error"]["code"] == "configuration_unavailable"
        await service.close_stdin()
        await service.wait(WAIT_S)
        stderr = await service.stderr_text()
    _no_paths(stderr, home, project)
    for line in stderr.splitlines():
        assert line.startswith("magi-code: "), stderr


async def test_an_unsafe_home_is_reported_without_its_path(
    home: Path, project: Path, service_mode: str
) -> None:
    home.parent.chmod(0o777)  # a directory above MC_HOME that others may write
    try:
        code, stderr = await _run_to_eof(home, project, {})
    finally:
        home.parent.chmod(0o700)
    assert code == 1
    _no_paths(stderr, home.parent, home, project)
    (line,) = stderr.splitlines()
    assert "writable by others" in line, line


async def test_a_home_that_is_a_file_is_reported_without_its_path(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home-file"
    home.write_text("not a directory\n")
    # Run directly: no daemon can exist for this home, so none is stopped afterwards.
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "magi_code", "--app", "service"],
        cwd=project,
        env=service_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    code, stderr = done.returncode, done.stderr
    assert code == 1
    _no_paths(stderr, home, project)
    (line,) = stderr.splitlines()
    assert line.startswith("magi-code: ") and "directory" in line, line
