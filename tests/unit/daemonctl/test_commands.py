"""``daemon status|stop`` against sockets that are not a daemon of ours: bounded, one line.

Real Unix sockets, no daemon: a listener that never answers (a stopped daemon), and one
whose peer check fails (another user's; the check is replaced, so no root is needed).
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from magi_code.client import channel
from magi_code.daemonctl import commands
from magi_code.endpoint.paths import ensure_private_dir, runtime_paths
from magi_code.storage.launch import LaunchContext


@pytest.fixture
def ctx(tmp_path: Path) -> LaunchContext:
    home = tmp_path / "mc-home"
    home.mkdir()
    return LaunchContext(home, home, {"MC_HOME": str(home)})


@pytest.fixture
def silent_listener(ctx: LaunchContext) -> Iterator[Path]:
    """A socket at the daemon's path that queues connections and never answers."""
    paths = runtime_paths(ctx)
    ensure_private_dir(paths.socket_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(paths.socket))
        listener.listen(16)
        yield paths.socket


def _stderr_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("magi-code: "), err
    return lines[0]


def _answering_within(ctx: LaunchContext, seconds: float) -> LaunchContext:
    return dataclasses.replace(
        ctx, env={**ctx.env, "MC_DAEMON_ANSWER_TIMEOUT_SECONDS": str(seconds)}
    )


def test_stop_of_a_daemon_that_does_not_answer_fails_promptly_and_touches_nothing(
    ctx: LaunchContext,
    silent_listener: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = _answering_within(ctx, 0.5)
    inode = silent_listener.stat().st_ino
    started = time.monotonic()
    code = commands.main(ctx, "stop", json=False, print_unit=False)
    assert time.monotonic() - started < 5
    assert code == 1
    line = _stderr_line(capsys)
    assert "did not answer the handshake within 0.5 s" in line
    assert "Nothing was stopped" in line
    assert silent_listener.stat().st_ino == inode


def test_status_reports_a_timeout_without_calling_it_a_daemon(
    ctx: LaunchContext,
    silent_listener: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = _answering_within(ctx, 0.5)
    started = time.monotonic()
    assert commands.main(ctx, "status", json=True, print_unit=False) == 0
    assert time.monotonic() - started < 5
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["running"] is False  # nobody holds this home's lifetime lock
    assert silent_listener.exists()


def test_status_says_when_the_socket_is_served_by_another_user(
    ctx: LaunchContext,
    silent_listener: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channel, "check_peer", lambda sock: False)
    assert commands.main(ctx, "status", json=True, print_unit=False) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["running"] is False
    assert doc["error"] == "the socket is served by another user"
    assert commands.main(ctx, "status", json=False, print_unit=False) == 1
    out = capsys.readouterr().out
    assert out.startswith("magi-code daemon not running: the socket is served by another user")
    assert commands.main(ctx, "stop", json=False, print_unit=False) == 1
    assert "served by another user" in _stderr_line(capsys)
    assert silent_listener.exists()


def test_nothing_listening_is_not_running(
    ctx: LaunchContext, capsys: pytest.CaptureFixture[str]
) -> None:
    assert commands.main(ctx, "status", json=False, print_unit=False) == 3
    assert capsys.readouterr().out == "magi-code daemon not running\n"
    assert commands.main(ctx, "stop", json=False, print_unit=False) == 0
    assert capsys.readouterr().out == "magi-code daemon not running\n"
