"""The tool barrier's ancestry rule, over real process trees (this process plays the daemon)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from magi_code.endpoint import ancestry
from magi_code.endpoint.ancestry import Lineage, is_tool_process, lineage

ME = os.getpid()


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def chain() -> Iterator[tuple[int, int, int]]:
    """(shell, inner shell, sleep): ``sh -c "sh -c 'sleep 30 & wait' & wait"`` under us."""
    outer = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30 & wait' & wait"])
    try:
        _wait_for(
            lambda: any(p.name() == "sleep" for p in psutil.Process(outer.pid).children(True)),
            "the sleep at the end of the chain",
        )
        (inner,) = psutil.Process(outer.pid).children()
        (sleeper,) = inner.children()
        yield outer.pid, inner.pid, sleeper.pid
    finally:
        for process in psutil.Process(outer.pid).children(recursive=True):
            _kill(process.pid)
        outer.kill()
        outer.wait(timeout=10)


def test_every_descendant_is_a_tool_process(chain: tuple[int, int, int]) -> None:
    for pid in chain:
        assert lineage(pid, ME) is Lineage.TOOL
        assert is_tool_process(pid, ME)


def test_the_daemon_pid_decides_whose_tools_they_are(chain: tuple[int, int, int]) -> None:
    outer, inner, sleeper = chain
    assert lineage(sleeper, inner) is Lineage.TOOL
    assert lineage(sleeper, outer) is Lineage.TOOL
    # Ancestors and siblings of the "daemon" are not its descendants.
    assert lineage(outer, inner) is Lineage.OTHER
    assert lineage(ME, outer) is Lineage.OTHER
    assert not is_tool_process(ME, outer)


def test_unrelated_processes_and_the_daemon_itself_are_admitted() -> None:
    for pid in (os.getppid(), 1, ME):
        assert lineage(pid, ME) is Lineage.OTHER
        assert not is_tool_process(pid, ME)


def test_no_pid_is_admitted() -> None:
    for pid in (None, 0, -1):
        assert lineage(pid, ME) is Lineage.UNKNOWN
        assert not is_tool_process(pid, ME)


def test_a_peer_that_exited_before_the_check_is_refused() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)  # exited and reaped: no such process any more
    assert not psutil.pid_exists(gone.pid)
    assert lineage(gone.pid, ME) is Lineage.VANISHED
    assert is_tool_process(gone.pid, ME)


def test_an_exited_but_unreaped_child_is_still_a_tool_process() -> None:
    zombie = subprocess.Popen(["true"])
    try:
        _wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, "the zombie")
        assert lineage(zombie.pid, ME) is Lineage.TOOL
    finally:
        zombie.wait(timeout=10)


def test_a_re_parented_orphan_is_not_a_descendant_any_more() -> None:
    """The documented limit: once its parent exits, a backgrounded command escapes."""
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE, text=True
    )
    out, _ = shell.communicate(timeout=10)
    orphan = int(out)
    try:
        assert shell.returncode == 0
        _wait_for(lambda: psutil.Process(orphan).ppid() != shell.pid, "re-parenting")
        assert lineage(orphan, ME) is Lineage.OTHER
    finally:
        _kill(orphan)


class _Process:
    """Stands in for ``psutil.Process``: ``parents()`` fails as scripted, then answers."""

    failures: list[type[Exception]] = []
    answer: list[int] = []

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def parents(self) -> list[_Process]:
        if _Process.failures:
            raise _Process.failures.pop(0)(self.pid)
        return [_Process(pid) for pid in _Process.answer]


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[_Process]:
    monkeypatch.setattr(psutil, "Process", _Process)
    monkeypatch.setattr(psutil, "pid_exists", lambda pid: pid == 4242)
    _Process.failures = []
    _Process.answer = [4000, ME, 1]
    return _Process


def test_an_ancestor_exiting_mid_walk_is_walked_again(scripted: type[_Process]) -> None:
    scripted.failures = [psutil.NoSuchProcess, psutil.NoSuchProcess]
    assert lineage(4242, ME) is Lineage.TOOL
    assert scripted.failures == []
    scripted.failures = [psutil.NoSuchProcess]
    scripted.answer = [4000, 1]  # re-parented meanwhile
    assert lineage(4242, ME) is Lineage.OTHER


def test_a_chain_that_keeps_changing_is_refused(scripted: type[_Process]) -> None:
    scripted.failures = [psutil.NoSuchProcess] * ancestry.WALK_ATTEMPTS
    assert lineage(4242, ME) is Lineage.VANISHED
    assert is_tool_process(4242, ME)


def test_the_peer_itself_gone_mid_walk_is_refused(scripted: type[_Process]) -> None:
    scripted.failures = [psutil.NoSuchProcess]
    assert lineage(4343, ME) is Lineage.VANISHED  # pid_exists(4343) is False


def test_access_denied_is_admitted(scripted: type[_Process]) -> None:
    scripted.failures = [psutil.AccessDenied]
    assert lineage(4242, ME) is Lineage.UNKNOWN
    scripted.failures = [psutil.AccessDenied]
    assert not is_tool_process(4242, ME)
