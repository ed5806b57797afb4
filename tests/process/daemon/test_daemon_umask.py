"""The user's file modes in the project (issue #13 item 3): what the agent's shell tool and
write_file tool create gets the *frontend's* umask, in both service modes.

The daemon runs under umask 077 and serves every frontend of its user, so the frontend
sends its mask at hello and each connection's turns use their own. Each frontend here is
a real ``magi-code --app service`` started under a given umask; in daemon mode the first
one starts the daemon.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from magi_code.endpoint.paths import read_info
from tests.process.daemon.support import paths
from tests.process.turn_support import run_turn, tool_call, write_settings
from tests.support import service
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.modes import service_mode
from tests.support.service import ServiceProcess, service_env, spawn

# Both modes (this directory's conftest pins daemon mode): each applies the frontend's mask.
pytestmark = pytest.mark.both_modes
__all__ = ["service_mode"]


async def frontend(home: Path, project: Path, umask: int) -> ServiceProcess:
    """``ServiceProcess.start`` with the child's umask set (Popen ``umask=``)."""
    proc = await spawn(project, service_env(home), umask=umask)
    svc = ServiceProcess(proc, home, service.current_mode())
    try:
        await svc.initialize()
    except BaseException:
        await svc.stop()
        raise
    return svc


async def make_files(svc: ServiceProcess, fake: FakeProviderServer, name: str) -> None:
    """One turn: the shell tool makes ``<name>/`` and ``<name>/f``; write_file makes
    ``<name>-w/sub/new.txt`` (two new parent directories)."""
    fake.enqueue(
        Reply(tool_calls=(tool_call("s1", "shell", command=f"mkdir {name} && touch {name}/f"),)),
        Reply(
            tool_calls=(tool_call("w1", "write_file", path=f"{name}-w/sub/new.txt", content="x"),)
        ),
        Reply(text=["done"]),
    )
    _, turn = await run_turn(svc, f"make {name}")
    assert turn.terminal["status"] == "completed", turn.terminal
    statuses = [a["status"] for a in turn.of_kind("tool") if a["status"] != "running"]
    assert statuses == ["completed", "completed"], turn.activities


def modes(project: Path, name: str) -> tuple[int, ...]:
    return tuple(
        stat.S_IMODE((project / relative).stat().st_mode)
        for relative in (
            name,
            f"{name}/f",
            f"{name}-w",
            f"{name}-w/sub",
            f"{name}-w/sub/new.txt",
        )
    )


def created_under(umask: int) -> tuple[int, ...]:
    directory, file = 0o777 & ~umask, 0o666 & ~umask
    return (directory, file, directory, directory, file)


def daemon_umask(home: Path) -> int:
    info = read_info(paths(home))
    assert info is not None
    for line in Path(f"/proc/{info['pid']}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask line")


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
async def test_tools_create_project_files_with_the_frontends_umask(
    home: Path, project: Path, fake: FakeProviderServer, service_mode: str, umask: int
) -> None:
    write_settings(home, fake)
    svc = await frontend(home, project, umask)
    try:
        await make_files(svc, fake, "d")
        assert modes(project, "d") == created_under(umask)
        if service_mode == "daemon" and Path("/proc/self/status").exists():
            # The daemon this frontend started keeps its own private mask.
            assert daemon_umask(home) == 0o077
    finally:
        await svc.stop()


async def test_each_connection_uses_its_own_frontends_umask(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """A daemon started by a 077 frontend serves a 022 frontend with 022, and both at once."""
    write_settings(home, fake)
    private = await frontend(home, project, 0o077)
    try:
        await make_files(private, fake, "first")
        shared = await frontend(home, project, 0o022)
        try:
            await make_files(shared, fake, "second")
            await make_files(private, fake, "third")
        finally:
            await shared.stop()
    finally:
        await private.stop()
    assert modes(project, "first") == created_under(0o077)
    assert modes(project, "second") == created_under(0o022)
    assert modes(project, "third") == created_under(0o077)
