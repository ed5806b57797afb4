"""``daemon run`` under a (stand-in) systemd: ``READY=1`` once it answers, ``STOPPING=1``.

A datagram socket bound here plays the service manager's notify socket; the daemon runs
as a real foreground process (``daemon run``, as the unit starts it), re-exec'ing itself
with its allow-listed environment, which must keep ``NOTIFY_SOCKET``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.process.daemon.support import cli, end_foreground, start_foreground, status

READY_TIMEOUT = 60.0
Starter = Callable[[str], "subprocess.Popen[bytes]"]


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket and its ``NOTIFY_SOCKET`` value (a short path)."""
    directory = tempfile.mkdtemp(prefix="mc-notify-", dir="/tmp")
    path = os.path.join(directory, "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(READY_TIMEOUT)
        yield sock, path
    os.unlink(path)
    os.rmdir(directory)


@pytest.fixture
def foreground(home: Path, tmp_path: Path) -> Iterator[Starter]:
    """Start ``daemon run`` with a ``NOTIFY_SOCKET``; every process is ended at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(notify: str) -> subprocess.Popen[bytes]:
        # An extra variable makes the daemon re-exec with its allow-list, as under systemd.
        proc = start_foreground(
            home, {"NOTIFY_SOCKET": notify, "MANAGERPID": "1"}, tmp_path / "daemon.stderr"
        )
        procs.append(proc)
        return proc

    yield start
    end_foreground(home, procs)


def _message(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


def test_ready_once_answering_and_stopping_on_daemon_stop(
    home: Path, foreground: Starter, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    proc = foreground(path)
    ready = _message(sock)
    # At READY=1 the daemon already answers: a unit ordered after it can use it.
    info = status(home)
    assert ready["READY"] == "1"
    assert ready["MAINPID"] == str(proc.pid)
    assert "/" not in ready["STATUS"]  # no paths in what `systemctl status` shows
    assert info["running"] is True and info["pid"] == proc.pid
    stopped = cli(home, "daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    stopping = _message(sock)
    assert stopping["STOPPING"] == "1"
    assert "control" in stopping["STATUS"]
    assert proc.wait(timeout=60) == 0
    sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        sock.recv(4096)  # one READY, one STOPPING, nothing else


def test_sigterm_from_the_manager_says_stopping_then_exits_zero(
    foreground: Starter, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    proc = foreground(path)
    assert _message(sock)["READY"] == "1"
    proc.send_signal(signal.SIGTERM)
    stopping = _message(sock)
    assert stopping["STOPPING"] == "1"
    assert "signal" in stopping["STATUS"]
    assert proc.wait(timeout=60) == 0


def test_an_abstract_notify_socket_is_reached(home: Path, foreground: Starter) -> None:
    name = f"mc-notify-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(READY_TIMEOUT)
        proc = foreground(f"@{name}")
        ready = _message(sock)
        assert ready["READY"] == "1" and ready["MAINPID"] == str(proc.pid)
        assert status(home)["running"] is True
        assert cli(home, "daemon", "stop").returncode == 0
        assert _message(sock)["STOPPING"] == "1"
    assert proc.wait(timeout=60) == 0


def test_an_on_demand_daemon_never_speaks_for_its_starters_manager(
    home: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    """A frontend run by a service manager starts a daemon: that manager hears nothing."""
    sock, path = notify_socket
    started = cli(home, "daemon", "start", extra={"NOTIFY_SOCKET": path})
    assert started.returncode == 0, started.stderr
    assert status(home)["running"] is True
    assert cli(home, "daemon", "stop").returncode == 0
    sock.settimeout(1.0)
    with pytest.raises(TimeoutError):
        sock.recv(4096)
