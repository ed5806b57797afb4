"""sd_notify without libsystemd: datagrams to ``$NOTIFY_SOCKET``, best effort, never raising."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.daemon.lifecycle import _JournalFormatter
from magi_code.daemon.notify import Notifier, stderr_is_journal
from magi_code.tools.environment import child_environment, daemon_environment


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket at a short path (``sun_path`` holds 108 bytes)."""
    directory = tempfile.mkdtemp(prefix="mc-notify-", dir="/tmp")
    path = os.path.join(directory, "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        yield sock, path
    os.unlink(path)
    os.rmdir(directory)


def test_sends_each_assignment_on_its_own_line(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("serving\nnow")
    assert sock.recv(4096) == f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving now".encode()
    assert notifier.stopping("stopping (signal)")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping (signal)"


def test_an_at_sign_names_the_abstract_namespace() -> None:
    name = f"mc-notify-test-{secrets.token_hex(6)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier(f"@{name}").notify("READY=1")
        assert sock.recv(4096) == b"READY=1"


@pytest.mark.parametrize(
    "value", [None, "", "@", "relative/notify", "vsock:2:1234", "/tmp/with\0nul"]
)
def test_a_missing_or_unusable_address_is_a_silent_no_op(value: str | None) -> None:
    notifier = Notifier(value)
    assert not notifier.enabled
    assert notifier.notify("READY=1") is False
    assert Notifier.from_environment({}).notify("READY=1") is False


def test_a_failing_send_never_raises(tmp_path: Path) -> None:
    assert Notifier(str(tmp_path / "nobody-listens")).ready("x") is False
    assert Notifier("/" + "x" * 200).stopping("x") is False  # longer than sun_path
    stream = tmp_path / "stream"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(stream))
        sock.listen(1)
        assert Notifier(str(stream)).notify("READY=1") is False  # wrong socket type
    assert Notifier("/tmp").notify() is False  # nothing to say


def test_the_journal_is_recognised_by_the_device_and_inode_of_fd_2() -> None:
    st = os.fstat(2)
    assert stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert not stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})
    for value in ("", "garbage", f"{st.st_dev}", f"{st.st_dev}:", f"-1:{st.st_ino}"):
        assert not stderr_is_journal({"JOURNAL_STREAM": value})
    assert not stderr_is_journal({})


def test_journal_lines_carry_a_syslog_priority_and_no_timestamp() -> None:
    formatter = _JournalFormatter(logging.Formatter("%(name)s: %(message)s"))

    def line(level: int, message: str) -> str:
        return formatter.format(
            logging.LogRecord("magi_code.daemon", level, "", 0, message, (), None)
        )

    assert line(logging.INFO, "listening") == "<6>magi_code.daemon: listening"
    assert line(logging.WARNING, "w") == "<4>magi_code.daemon: w"
    assert line(logging.ERROR, "a\nb") == "<3>magi_code.daemon: a\n<3>b"  # every line


def test_the_daemon_keeps_the_manager_variables_and_tools_never_get_them() -> None:
    env = {"PATH": "/bin", "NOTIFY_SOCKET": "/run/user/1/systemd/notify", "JOURNAL_STREAM": "8:9"}
    assert daemon_environment(env) == env
    assert child_environment(env) == {"PATH": "/bin"}
