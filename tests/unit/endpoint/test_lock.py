"""Lifetime lock, start lock and socket-cleanup rules, against real processes and files."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.endpoint.lock import (
    LifetimeLock,
    LockNotHeld,
    SocketInUse,
    StartLockTimeout,
    bind_socket,
    is_held,
    remove_own_socket,
    remove_stale_socket,
    socket_identity,
    socket_is_live,
    start_lock,
)
from magi_code.endpoint.paths import UnsafeRuntimeDir

HOLDER = """
import sys
from pathlib import Path
from magi_code.endpoint.lock import LifetimeLock, start_lock
if sys.argv[1] == "lifetime":
    held = LifetimeLock.acquire(Path(sys.argv[2]))
    print("locked" if held else "busy", flush=True)
    sys.stdin.read()
else:
    with start_lock(Path(sys.argv[2]), timeout=5):
        print("locked", flush=True)
        sys.stdin.read()
"""

PROBER = """
import sys
from pathlib import Path
from magi_code.endpoint.lock import is_held
path = Path(sys.argv[1])
print("probing", flush=True)
while True:
    is_held(path)
"""


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return run / "daemon.lock"


@pytest.fixture
def holder(lock_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "lifetime", str(lock_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def must_acquire(path: Path) -> LifetimeLock:
    lock = LifetimeLock.acquire(path)
    assert lock is not None
    return lock


def test_acquire_creates_private_file_and_release_never_removes_it(lock_path: Path) -> None:
    lock = LifetimeLock.acquire(lock_path)
    assert lock is not None and lock.held
    st = os.lstat(lock_path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    lock.release()
    lock.release()  # idempotent
    with pytest.raises(LockNotHeld):
        lock.fileno()
    assert os.lstat(lock_path).st_ino == st.st_ino


def test_second_acquire_in_same_process_is_refused_until_release(lock_path: Path) -> None:
    with must_acquire(lock_path) as first:
        assert first.held
        assert LifetimeLock.acquire(lock_path) is None
        assert is_held(lock_path)
    again = LifetimeLock.acquire(lock_path)
    assert again is not None
    again.release()


def test_lock_held_by_another_process_is_refused(
    lock_path: Path, holder: subprocess.Popen[str]
) -> None:
    assert is_held(lock_path)
    assert LifetimeLock.acquire(lock_path) is None


def test_sigkill_of_holder_frees_the_lock_and_keeps_the_inode(
    lock_path: Path, holder: subprocess.Popen[str]
) -> None:
    inode = os.lstat(lock_path).st_ino
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert not is_held(lock_path)
    lock = LifetimeLock.acquire(lock_path)
    assert lock is not None
    assert os.lstat(lock_path).st_ino == inode
    assert lock.still_owns_path()
    lock.release()


def test_probe_never_creates_the_lock_file(lock_path: Path) -> None:
    assert not is_held(lock_path)
    assert not lock_path.exists()
    assert not is_held(lock_path.parent / "absent-dir" / "daemon.lock")


def test_concurrent_probes_do_not_make_acquire_report_a_live_daemon(lock_path: Path) -> None:
    must_acquire(lock_path).release()
    probers = [
        subprocess.Popen(
            [sys.executable, "-c", PROBER, str(lock_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    try:
        for proc in probers:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "probing"
        # Without the probe-tolerant retry about 1% of these fail on a 2-CPU machine.
        for _ in range(2000):
            lock = LifetimeLock.acquire(lock_path)
            assert lock is not None
            lock.release()
    finally:
        for proc in probers:
            proc.kill()
            proc.wait(timeout=10)


def test_symlink_at_lock_path_is_refused_and_target_untouched(lock_path: Path) -> None:
    target = lock_path.parent / "victim"
    target.write_text("precious")
    lock_path.symlink_to(target)
    with pytest.raises(UnsafeRuntimeDir):
        LifetimeLock.acquire(lock_path)
    with pytest.raises(UnsafeRuntimeDir):
        is_held(lock_path)
    assert target.read_text() == "precious"


def test_fifo_at_lock_path_is_refused_without_blocking(lock_path: Path) -> None:
    os.mkfifo(lock_path, 0o600)
    with pytest.raises(UnsafeRuntimeDir):
        LifetimeLock.acquire(lock_path)
    with pytest.raises(UnsafeRuntimeDir):
        is_held(lock_path)


def test_self_check_notices_a_removed_lock_file(lock_path: Path) -> None:
    lock = LifetimeLock.acquire(lock_path)
    assert lock is not None
    os.unlink(lock_path)  # what an overeager cleaner would do
    assert not lock.still_owns_path()
    lock.release()


def test_released_lock_cannot_touch_the_socket(lock_path: Path) -> None:
    lock = LifetimeLock.acquire(lock_path)
    assert lock is not None
    lock.release()
    sock = lock_path.parent / "daemon.sock"
    with pytest.raises(LockNotHeld):
        remove_stale_socket(sock, lock)
    with pytest.raises(LockNotHeld):
        lock.fileno()


def bind_and_abandon(path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()  # the socket file stays, like after a crash


def test_holder_removes_stale_socket_but_not_other_files(lock_path: Path) -> None:
    sock = lock_path.parent / "daemon.sock"
    with must_acquire(lock_path) as lock:
        assert remove_stale_socket(sock, lock) is False
        bind_and_abandon(sock)
        assert remove_stale_socket(sock, lock) is True
        assert not os.path.lexists(sock)
        sock.write_text("not a socket")
        with pytest.raises(UnsafeRuntimeDir):
            remove_stale_socket(sock, lock)
        assert sock.read_text() == "not a socket"


def test_remove_own_socket_spares_a_replacement(lock_path: Path) -> None:
    sock = lock_path.parent / "daemon.sock"
    with must_acquire(lock_path) as lock:
        bind_and_abandon(sock)
        ours = socket_identity(sock)
        assert ours is not None
        os.rename(sock, sock.with_name("moved.sock"))  # keeps our inode alive, so no reuse
        bind_and_abandon(sock)  # someone else's socket now lives at the path
        assert remove_own_socket(sock, lock, ours) is False
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        current = socket_identity(sock)
        assert current is not None
        assert remove_own_socket(sock, lock, current) is True
        assert not os.path.lexists(sock)


def test_start_lock_serializes_starters(lock_path: Path) -> None:
    start = lock_path.parent / "start.lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "start", str(start)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(StartLockTimeout) as info, start_lock(start, timeout=0.2):
            pass
        assert str(start) not in str(info.value)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
        with start_lock(start, timeout=5):
            assert start.exists()
        assert start.exists()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_start_lock_never_creates_the_state_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), start_lock(tmp_path / "run" / "start.lock", 1):
        pass
    assert not (tmp_path / "run").exists()


def test_a_live_listener_is_never_removed_as_stale(lock_path: Path) -> None:
    """Whoever listens on the path (a daemon of another home, anyone), it is not ours."""
    sock = lock_path.parent / "daemon.sock"
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live,
        must_acquire(lock_path) as lock,
    ):
        live.bind(str(sock))
        live.listen(1)
        inode = os.stat(sock).st_ino
        assert socket_is_live(sock) is True
        with pytest.raises(SocketInUse, match="served by another live process"):
            remove_stale_socket(sock, lock)
        assert os.stat(sock).st_ino == inode
        live.close()
        assert socket_is_live(sock) is False  # closed: the file is stale now
        assert remove_stale_socket(sock, lock) is True


def test_socket_is_live_on_missing_and_dangling_paths(tmp_path: Path) -> None:
    assert socket_is_live(tmp_path / "missing.sock") is False
    dangling = tmp_path / "dangling.sock"
    dangling.symlink_to(tmp_path / "nowhere")
    assert socket_is_live(dangling) is False


def test_a_full_backlog_counts_as_live(tmp_path: Path) -> None:
    """A stopped daemon never accepts: its backlog fills, and it is still alive."""
    sock = tmp_path / "full.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(sock))
        live.listen(0)
        queued = []
        try:
            for _ in range(8):
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.setblocking(False)
                queued.append(client)
                try:
                    client.connect(str(sock))
                except BlockingIOError:
                    break
            assert socket_is_live(sock) is True
        finally:
            for client in queued:
                client.close()


def test_bind_socket_is_private_holder_only_and_never_replaces(lock_path: Path) -> None:
    sock = lock_path.parent / "daemon.sock"
    with must_acquire(lock_path) as lock:
        listener, identity = bind_socket(sock, lock)
        try:
            assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
            assert socket_identity(sock) == identity
            assert listener.getblocking() is False
            with pytest.raises(OSError):  # taken: EADDRINUSE, and nothing is unlinked
                bind_socket(sock, lock)
            assert socket_identity(sock) == identity
        finally:
            listener.close()
        assert remove_own_socket(sock, lock, identity) is True
    with pytest.raises(LockNotHeld):
        bind_socket(sock, lock)
    assert not os.path.lexists(sock)


def _make_read_only(path: Path) -> None:
    if os.geteuid() != 0:
        os.chmod(path, 0o500)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("as root a read-only directory needs chattr +i, unavailable here")


def _make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    else:
        os.chmod(path, 0o700)


def test_a_read_only_state_dir_is_an_operator_error_not_an_oserror(lock_path: Path) -> None:
    run = lock_path.parent
    _make_read_only(run)
    try:
        with (
            pytest.raises(UnsafeRuntimeDir, match="cannot open the start lock"),
            start_lock(run / "start.lock", timeout=1),
        ):
            pass
        with pytest.raises(UnsafeRuntimeDir, match="cannot open the lock file"):
            LifetimeLock.acquire(lock_path)
    finally:
        _make_writable(run)
