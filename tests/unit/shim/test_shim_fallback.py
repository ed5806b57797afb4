"""Which failures to reach the daemon make the default mode serve in-process, and its
``daemon.log`` line (the process tests are in ``tests/process/daemon/test_daemon_fallback.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from magi_code.client.errors import (
    DaemonDraining,
    DaemonError,
    DaemonTimeout,
    DaemonUnavailable,
    ForeignDaemon,
)
from magi_code.client.handshake import invalid_frames, no_answer, welcome_of
from magi_code.endpoint.paths import SocketPathTooLong, UnsafeRuntimeDir
from magi_code.protocol.v2 import Launch
from magi_code.shim.connect import StartFailed
from magi_code.shim.fallback import log_fallback, unusable


def _refusal(code: str) -> Exception:
    try:
        welcome_of({"t": "refused", "code": code})
    except DaemonError as exc:
        return exc
    raise AssertionError("not refused")


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (UnsafeRuntimeDir("runtime directory /x has mode 0755", "it has mode 0755"), "runtime_dir"),
        (
            SocketPathTooLong(
                "socket path /x is longer than 100 bytes", "the socket path is too long"
            ),
            "runtime_dir",
        ),
        (StartFailed("the daemon did not start"), "start_failed"),
        (no_answer(3.0), "no_answer"),
        (DaemonTimeout("the daemon is not accepting connections"), "no_answer"),
        (ForeignDaemon("the socket is served by another user"), "foreign_socket"),
    ],
)
def test_no_daemon_to_serve_us_is_a_fallback(exc: Exception, reason: str) -> None:
    assert unusable(exc) == reason


@pytest.mark.parametrize(
    "exc",
    [
        _refusal("tool_process"),
        _refusal("wrong_home"),
        _refusal("too_many_connections"),
        _refusal("unsupported_version"),
        invalid_frames(),
        DaemonError("the daemon answered with an unexpected frame", "protocol_error"),
    ],
)
def test_a_daemon_that_answered_and_refused_is_not_bypassed(exc: Exception) -> None:
    assert unusable(exc) is None


def test_no_daemon_running_is_never_the_final_failure() -> None:
    """``reach`` starts a daemon on these; they never end it (so they are no reason)."""
    assert unusable(DaemonUnavailable("no daemon is running")) is None
    assert unusable(DaemonDraining("the daemon is stopping")) is None


def _launch(home: Path, **env: str) -> Launch:
    return Launch(str(home), str(home), {"MC_HOME": str(home), **env}, 0o022)


def test_the_log_line_is_the_daemons_format_without_paths(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log_fallback(_launch(home), "start_failed")
    log = home / "run" / "daemon.log"
    [line] = log.read_text().splitlines()
    assert line.endswith(
        f" [{os.getpid()}] WARNING magi_code.shim: serving in-process reason=start_failed"
    )
    assert str(tmp_path) not in line
    assert (os.stat(home / "run").st_mode & 0o777, os.stat(log).st_mode & 0o777) == (0o700, 0o600)
    log_fallback(_launch(home, MC_LOG_FORMAT="json"), "no_answer")
    document = json.loads(log.read_text().splitlines()[1])
    assert (document["level"], document["message"]) == (
        "warning",
        "serving in-process reason=no_answer",
    )


def test_no_line_where_the_log_is_unusable_or_unwanted(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet"
    log_fallback(_launch(quiet, MC_LOG_LEVEL="error"), "runtime_dir")
    assert not (quiet / "run" / "daemon.log").exists()

    shared = tmp_path / "shared"
    (shared / "run").mkdir(parents=True)
    os.chmod(shared / "run", 0o755)  # not private: nothing is written there
    log_fallback(_launch(shared), "runtime_dir")
    assert not (shared / "run" / "daemon.log").exists()

    planted = tmp_path / "planted"
    (planted / "run").mkdir(parents=True, mode=0o700)
    os.mkfifo(planted / "run" / "daemon.log")  # no reader: must not hang
    log_fallback(_launch(planted), "runtime_dir")
    target = tmp_path / "elsewhere"
    linked = tmp_path / "linked"
    (linked / "run").mkdir(parents=True, mode=0o700)
    (linked / "run" / "daemon.log").symlink_to(target)
    log_fallback(_launch(linked), "runtime_dir")
    assert not target.exists()
