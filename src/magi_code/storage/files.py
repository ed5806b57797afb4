"""Durable file primitives shared by settings, auth, catalog cache and sessions.

Every file the service opens under ``MC_HOME`` (and in a session directory) goes through
:func:`open_regular`: any process of the same user, including the agent's own shell tool,
can plant a FIFO, socket or directory where the service expects a file, and a plain
``open()`` of a FIFO blocks its worker thread until a writer appears.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

# How often ``locked`` retries a contended lock (filelock's Timeout is kept for callers).
_LOCK_POLL: Final = 0.01


class NotRegularFileError(OSError):
    """The path names a FIFO, socket, device or directory, not a regular file.

    An ``OSError`` so that every caller's existing "unreadable file" handling applies. The
    message never names the path.
    """

    def __init__(self) -> None:
        super().__init__(errno.EINVAL, "not a regular file")


def open_regular(
    path: str | os.PathLike[str],
    flags: int,
    *,
    dir_fd: int | None = None,
    mode: int = 0o600,
    follow_symlinks: bool = False,
) -> int:
    """Open a regular file without ever blocking on what sits at ``path``; return the fd.

    The open adds ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for a peer),
    ``O_CLOEXEC``, ``O_NOCTTY`` and, unless ``follow_symlinks``, ``O_NOFOLLOW`` (a symlink
    fails with ``ELOOP``). It then ``fstat``s the fd: anything but a regular file is closed
    and refused, and a regular file gets ``O_NONBLOCK`` cleared again (unless the caller
    asked for it). ``mode`` applies when ``flags`` has ``O_CREAT``.

    Raises:
        NotRegularFileError: a FIFO, socket, device or directory is at ``path``.
        OSError: the open itself failed (missing file, ``ELOOP`` for a symlink, ``ENXIO``
            for a socket or a reader-less FIFO opened for writing, ``EISDIR``, ...).
    """
    extra = os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        extra |= os.O_NOFOLLOW
    fd = os.open(path, flags | extra, mode, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError()
        if not flags & os.O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], limit: int, *, follow_symlinks: bool) -> bytes:
    """At most ``limit + 1`` bytes of a regular file (so a caller can tell "too large").

    Raises:
        OSError: as :func:`open_regular`, or the read failed.
    """
    fd = open_regular(path, os.O_RDONLY, follow_symlinks=follow_symlinks)
    try:
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 65536))):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, fsync, rename.

    The rename replaces whatever directory entry is at ``path`` (a symlink, even a FIFO)
    without opening it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def locked(path: Path, timeout: float = 10.0) -> Iterator[None]:
    """Cross-process exclusive ``flock`` on ``<path>.lock`` (mode 0600, never unlinked).

    The lock file is opened with :func:`open_regular`, so a symlink, FIFO or directory at
    its path fails at once instead of being followed or blocking. A contended lock is
    retried until ``timeout`` elapses. Threads of one process exclude each other too: each
    call opens its own file description.

    Raises:
        filelock.Timeout: the lock stayed held for ``timeout`` seconds (a ``TimeoutError``).
        OSError: the lock file cannot be opened or is not a regular file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = str(path) + ".lock"
    fd = open_regular(lock_path, os.O_RDWR | os.O_CREAT, mode=0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    # Imported only here: filelock costs a cold start ~25 ms (logging,
                    # secrets, decimal), before the shim can even spawn the daemon.
                    from filelock import Timeout

                    raise Timeout(lock_path) from None
                time.sleep(_LOCK_POLL)
        yield
    finally:
        os.close(fd)  # closing the only fd of this open file description drops the flock
