"""The daemon's lifetime lock, the start lock, and the socket-cleanup rules they authorize.

The lifetime lock is an exclusive ``flock`` on ``daemon.lock`` held for the daemon's whole
life. The kernel drops it on any exit, including SIGKILL, so "the lock can be taken" is the
only proof that no daemon runs. The file is never unlinked: its inode *is* the mutex, and
unlinking it would let a second daemon lock a fresh inode while the first still runs.

Only the holder may create or unlink the socket; the helpers below take the held
:class:`LifetimeLock` as an argument so a caller without it cannot even express the call.
The lock and the socket path belong to one ``MC_HOME`` (``endpoint.paths`` gives every home
its own socket path), so a holder only ever touches its own home's path, and even there it
never unlinks a socket some live process is listening on (:func:`remove_stale_socket`).

The start lock (``start.lock``) serializes ``daemon start`` across client processes: a
starter takes it, re-tries connecting, spawns the daemon only if that fails, and keeps it
until the daemon is reachable or has exited. It does not decide who runs; the lifetime lock
does, so a supervisor-started daemon (systemd/launchd) never needs it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.endpoint.paths import UnsafeRuntimeDir, verify_private_dir
from magi_code.storage.files import locked

# is_held() probes take a shared lock for microseconds; an exclusive acquire that collides
# with only probes retries instead of reporting a live daemon.
_PROBE_RETRIES: Final = 200
_PROBE_BACKOFF_SECONDS: Final = 0.001
# Bounded retries when the lock file was replaced under us (someone removed it by hand).
_REPLACED_RETRIES: Final = 3


class LockNotHeld(Exception):
    """A holder-only operation was called with a released lock."""


class StartLockTimeout(Exception):
    """Another process kept the start lock for longer than the caller was willing to wait."""


class SocketInUse(UnsafeRuntimeDir):
    """A live process listens on the socket path; it is never removed or replaced."""


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """``(st_dev, st_ino)`` of a file, to tell "ours" from a replacement at the same path."""

    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino)


class LifetimeLock:
    """An exclusive ``flock`` on the lifetime lock file; see the module docstring."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path) -> LifetimeLock | None:
        """Take the lock, or return ``None`` when another live process holds it.

        Raises :class:`UnsafeRuntimeDir` when ``path`` is a symlink or not a regular file of
        ours. The file is created mode 0600 and never truncated or unlinked.
        """
        for _ in range(_REPLACED_RETRIES):
            fd = _open_lock_file(path)
            try:
                if not _lock_exclusive(fd):
                    os.close(fd)
                    return None
                # A waiter that locked an inode someone unlinked must not think it owns the
                # path's lock (filelock#577): only the inode currently at ``path`` counts.
                same = _is_file_at(fd, path)
            except BaseException:
                os.close(fd)
                raise
            if same:
                return cls(path, fd)
            os.close(fd)
        return None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        if self._fd is None:
            raise LockNotHeld("the lifetime lock has been released")
        return self._fd

    def still_owns_path(self) -> bool:
        """True when the lock file at ``path`` is still the inode we hold (self-check)."""
        return _is_file_at(self.fileno(), self.path)

    def release(self) -> None:
        """Unlock and close; idempotent. The lock file stays in place."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> LifetimeLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def is_held(path: Path) -> bool:
    """Probe for clients: is a live process holding the lifetime lock at ``path``?

    Never creates the file, never unlinks anything, and holds a shared lock only for the
    duration of the probe (:meth:`LifetimeLock.acquire` tolerates that).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError:
        raise UnsafeRuntimeDir(
            f"lock file {path} cannot be opened safely; remove it",
            "the daemon's lock file cannot be opened safely",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeRuntimeDir(
                f"lock file {path} is not a regular file; remove it",
                "the daemon's lock file is not a regular file",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def socket_identity(sock_path: Path) -> FileIdentity | None:
    """Identity of the file at ``sock_path`` right after bind, for :func:`remove_own_socket`."""
    try:
        return _identity_at(sock_path)
    except FileNotFoundError:
        return None


def socket_is_live(sock_path: Path) -> bool:
    """True when a process accepts (or queues) connections on the socket at ``sock_path``.

    A non-blocking ``connect`` that is refused means nobody listens: the file is stale. One
    that succeeds or would block (a full backlog) means a live listener, even a stopped or
    wedged one. Nothing is sent; the probe connection is closed at once.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.setblocking(False)
        try:
            probe.connect(os.fspath(sock_path))
        except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError):
            return False
        except BlockingIOError:
            return True
        except OSError:
            # EACCES: a socket of another user; EPROTOTYPE: not a stream socket. Either
            # way, not a file a dead daemon of ours left behind.
            return True
        return True
    finally:
        probe.close()


def remove_stale_socket(sock_path: Path, lock: LifetimeLock) -> bool:
    """Before bind: unlink whatever a dead daemon left at ``sock_path``. Holder only.

    Returns True when something was removed. A dangling symlink or a socket nobody listens
    on is removed. A socket some live process listens on raises :class:`SocketInUse`
    (whoever bound it, it is not ours to remove); any other file type raises
    :class:`UnsafeRuntimeDir` (an operator must look at it).
    """
    _require_held(lock)
    try:
        st = os.lstat(sock_path)
    except FileNotFoundError:
        return False
    if not (stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UnsafeRuntimeDir(
            f"{sock_path} exists and is not a socket; remove it",
            "another kind of file is at the daemon's socket path",
        )
    if socket_is_live(sock_path):
        raise SocketInUse(
            f"socket path {sock_path} is served by another live process; it is not removed. "
            "Stop that process, or set MC_RUNTIME_DIR to another private directory",
            "another live process serves the daemon's socket path",
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    return True


def bind_socket(sock_path: Path, lock: LifetimeLock) -> tuple[socket.socket, FileIdentity]:
    """Bind and listen on ``sock_path`` (0600, never wider); holder only.

    Call :func:`remove_stale_socket` first. Returns the non-blocking listening socket and
    the identity of the file it created, for :func:`remove_own_socket`. A path that is
    taken meanwhile raises ``OSError`` (``EADDRINUSE``); nothing is unlinked.
    """
    _require_held(lock)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(0o177)  # no window where the socket is wider than 0600
        try:
            sock.bind(os.fspath(sock_path))
        finally:
            os.umask(previous)
        identity = _identity_at(sock_path)
        os.chmod(sock_path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock, identity


def remove_own_socket(sock_path: Path, lock: LifetimeLock, identity: FileIdentity) -> bool:
    """On exit: unlink ``sock_path`` only if it is still the socket we bound. Holder only."""
    _require_held(lock)
    if socket_identity(sock_path) != identity:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    return True


@contextlib.contextmanager
def start_lock(path: Path, timeout: float) -> Iterator[None]:
    """Hold the start lock at ``path`` (``start.lock``) for at most ``timeout`` s of waiting.

    The state dir must already be private (``ensure_private_dir``); a missing one raises
    ``FileNotFoundError`` rather than being created with default permissions. Blocking: call
    it from a worker thread when on an event loop.
    """
    if path.suffix != ".lock":
        raise ValueError("start lock path must end in .lock")
    verify_private_dir(path.parent)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(locked(path.with_suffix(""), timeout=timeout))
    except TimeoutError:  # filelock.Timeout, not imported (see storage.files.locked)
        # filelock's message names the path; ours must not.
        raise StartLockTimeout("timed out waiting for another daemon start") from None
    except OSError as exc:  # a read-only MC_HOME, a full disk
        raise UnsafeRuntimeDir(
            f"cannot open the start lock {path}: {_reason(exc)}",
            f"the daemon's start lock cannot be opened ({_reason(exc)})",
        ) from None
    with stack:
        yield


def _open_lock_file(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if isinstance(exc, PermissionError | FileNotFoundError) or exc.errno in (
            errno.EROFS,
            errno.ENOSPC,
            errno.EDQUOT,
        ):
            raise UnsafeRuntimeDir(
                f"cannot open the lock file {path}: {_reason(exc)}",
                f"the daemon's lock file cannot be opened ({_reason(exc)})",
            ) from None
        raise UnsafeRuntimeDir(
            f"lock file {path} cannot be opened safely; remove it",
            "the daemon's lock file cannot be opened safely",
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafeRuntimeDir(
            f"lock file {path} is not a regular file of ours; remove it",
            "the daemon's lock file is not a regular file of ours",
        )
    return fd


def _lock_exclusive(fd: int) -> bool:
    for _ in range(_PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # an exclusive holder: a live daemon
        # Only shared holders (is_held probes): let them finish and try again.
        fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep(_PROBE_BACKOFF_SECONDS)
    return False


def _is_file_at(fd: int, path: Path) -> bool:
    try:
        return FileIdentity.of(os.fstat(fd)) == _identity_at(path)
    except FileNotFoundError:
        return False


def _identity_at(path: Path) -> FileIdentity:
    return FileIdentity.of(os.stat(path, follow_symlinks=False))


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _require_held(lock: LifetimeLock) -> None:
    if not lock.held:
        raise LockNotHeld("only the lifetime lock holder may touch the socket path")
