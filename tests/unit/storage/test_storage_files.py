"""storage.files on real files: open_regular refuses special files without blocking, the
bounded reader, and ``locked`` on a hostile lock path."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import filelock
import pytest

from magi_code.storage.files import NotRegularFileError, locked, open_regular, read_regular

T = TypeVar("T")

# A blocked open would wait forever; this only bounds how long a failing test hangs.
BOUND_S = 10.0


def promptly(call: Callable[[], T]) -> T:
    """``call()`` in a worker thread; fails (instead of hanging) if it does not return."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(call).result(timeout=BOUND_S)
    finally:
        pool.shutdown(wait=False)


def test_regular_file_opens_and_is_blocking_again(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"data")
    fd = open_regular(path, os.O_RDONLY)
    try:
        assert os.read(fd, 10) == b"data"
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        assert not flags & os.O_NONBLOCK
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(fd)


def test_requested_nonblock_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    fd = open_regular(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(fd)


def test_create_uses_mode_and_dir_fd(tmp_path: Path) -> None:
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = open_regular("new", os.O_RDWR | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd, mode=0o600)
        os.close(fd)
    finally:
        os.close(dir_fd)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_RDWR, os.O_RDWR | os.O_CREAT])
def test_fifo_is_refused_without_blocking(tmp_path: Path, fifos: list[Path], flags: int) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path, 0o600)
    fifos.append(path)
    with pytest.raises(NotRegularFileError) as info:
        promptly(lambda: open_regular(path, flags))
    assert isinstance(info.value, OSError)
    assert str(path) not in str(info.value)  # the message never names the path


def test_fifo_opened_for_writing_fails_fast(tmp_path: Path, fifos: list[Path]) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path, 0o600)
    fifos.append(path)
    with pytest.raises(OSError) as info:  # no reader: ENXIO instead of waiting for one
        promptly(lambda: open_regular(path, os.O_WRONLY | os.O_APPEND))
    assert info.value.errno == errno.ENXIO


def test_fifo_through_dir_fd_is_refused(tmp_path: Path, fifos: list[Path]) -> None:
    os.mkfifo(tmp_path / "fifo", 0o600)
    fifos.append(tmp_path / "fifo")
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(NotRegularFileError):
            promptly(lambda: open_regular("fifo", os.O_RDONLY, dir_fd=dir_fd))
    finally:
        os.close(dir_fd)


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFileError):
        open_regular(tmp_path, os.O_RDONLY)
    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path, os.O_RDWR)


def test_socket_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative name keeps sun_path short
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("s.sock")
        server.listen()
        for flags in (os.O_RDONLY, os.O_RDWR):
            with pytest.raises(OSError) as info:
                promptly(lambda flags=flags: open_regular(tmp_path / "s.sock", flags))
            assert info.value.errno == errno.ENXIO


def test_symlink_is_refused_unless_followed(tmp_path: Path, fifos: list[Path]) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"secret")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OSError) as info:
        open_regular(link, os.O_RDONLY)
    assert info.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        open_regular(link, os.O_RDWR | os.O_CREAT)
    assert read_regular(link, 100, follow_symlinks=True) == b"secret"
    # Following a link still refuses the special file behind it.
    os.mkfifo(tmp_path / "fifo", 0o600)
    fifos.append(tmp_path / "fifo")
    (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
    with pytest.raises(NotRegularFileError):
        promptly(lambda: read_regular(tmp_path / "to-fifo", 100, follow_symlinks=True))


def test_read_regular_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 200_000)
    assert len(read_regular(path, 10, follow_symlinks=False)) == 11
    assert len(read_regular(path, 150_000, follow_symlinks=False)) == 150_001
    assert read_regular(path, 500_000, follow_symlinks=False) == b"x" * 200_000
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 10, follow_symlinks=False)


def test_locked_creates_a_private_lock_file(tmp_path: Path) -> None:
    target = tmp_path / "dir" / "settings.json"
    with locked(target, timeout=1):
        lock_file = tmp_path / "dir" / "settings.json.lock"
        assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600
    assert lock_file.exists()  # never unlinked: the inode is the mutex
    with locked(target, timeout=1):
        pass


def test_locked_times_out_while_held(tmp_path: Path) -> None:
    target = tmp_path / "auth.json"
    # The inner call opens another file description, as another process or thread would.
    with locked(target, timeout=1), pytest.raises(filelock.Timeout), locked(target, 0.05):
        pass
    with locked(target, timeout=0.05):
        pass


def test_locked_refuses_a_fifo_lock_path_fast(tmp_path: Path, fifos: list[Path]) -> None:
    target = tmp_path / "settings.json"
    os.mkfifo(str(target) + ".lock", 0o600)
    fifos.append(Path(str(target) + ".lock"))

    def take() -> None:
        with locked(target, timeout=5):
            raise AssertionError("a FIFO lock file was taken")

    with pytest.raises(NotRegularFileError):
        promptly(take)


def test_locked_never_follows_a_symlinked_lock_path(tmp_path: Path) -> None:
    target = tmp_path / "settings.json"
    elsewhere = tmp_path / "elsewhere"
    Path(str(target) + ".lock").symlink_to(elsewhere)
    with pytest.raises(OSError) as info, locked(target, timeout=1):
        pass
    assert info.value.errno == errno.ELOOP
    assert not elsewhere.exists()
