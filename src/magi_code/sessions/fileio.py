"""Low-level session file helpers: layout names, flock with bounded retry, whole reads
and writes, torn-tail repair. Blocking; callers run them in worker threads."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from typing import Final

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.records import decode_line

HISTORY: Final = "history.jsonl"
APPEND_LOCK: Final = "append.lock"
LEASE_LOCK: Final = "lease.lock"
META: Final = "meta.json"
NEW_PREFIX: Final = ".new-"
# A session being removed (``SessionStore.remove``): no longer found by its ID.
REMOVING_PREFIX: Final = ".rm-"

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
NOFOLLOW: Final = os.O_NOFOLLOW | os.O_CLOEXEC
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
# The sessions root itself may be a symbolic link (the user's choice of where it lives).
ROOT_DIR_FLAGS: Final = DIR_FLAGS & ~os.O_NOFOLLOW

_LOCK_POLL: Final = 0.002
_CHUNK: Final = 64 * 1024


def unavailable() -> ServiceError:
    return ServiceError(ErrorCode.SESSION_UNAVAILABLE)


def flock_wait(fd: int, operation: int, wait: float) -> None:
    """Take ``operation`` (LOCK_SH/LOCK_EX) on ``fd``, retrying until ``wait`` elapses.

    Raises:
        ServiceError: ``SESSION_BUSY`` when the lock is still held by someone else.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ServiceError(ErrorCode.SESSION_BUSY) from None
            time.sleep(_LOCK_POLL)


@contextlib.contextmanager
def holding(fd: int, operation: int, wait: float) -> Iterator[None]:
    flock_wait(fd, operation, wait)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def pread_all(fd: int, length: int, offset: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def close_all(fds: list[int]) -> None:
    for fd in reversed(fds):
        with contextlib.suppress(OSError):
            os.close(fd)


def repair_torn_tail(fd: int) -> None:
    """Truncate a final segment without ``\\n`` (an append interrupted by a crash).

    The torn bytes were never acknowledged (an append returns only after fsync of the
    whole line), so dropping them loses nothing; leaving them would glue the next record
    onto the fragment and make it unreadable too.
    """
    size = os.fstat(fd).st_size
    cut = complete_prefix(fd, size)
    if cut == size:
        return
    os.ftruncate(fd, cut)
    os.fsync(fd)


def complete_prefix(fd: int, size: int) -> int:
    """The length of the first ``size`` bytes up to and including their last ``\\n``.

    Taken under the append lock (shared or exclusive), bytes before that point are whole
    lines that never change again: appends go after them, a torn-tail repair only drops
    bytes after them, and a failed append is rolled back before it releases the lock.
    ``0`` when there is no complete line.
    """
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    pos = size
    while pos > 0:
        step = min(_CHUNK, pos)
        pos -= step
        newline = os.pread(fd, step, pos).rfind(b"\n")
        if newline >= 0:
            return pos + newline + 1
    return 0


def last_valid_seq(fd: int) -> int:
    """The ``seq`` of the last decodable record, scanning backwards; ``-1`` if none."""
    pos = os.fstat(fd).st_size
    carry = b""
    while pos > 0:
        step = min(_CHUNK, pos)
        pos -= step
        lines = (os.pread(fd, step, pos) + carry).split(b"\n")
        carry = lines.pop(0) if pos > 0 else b""
        for line in reversed(lines):
            record = decode_line(line)
            if record is not None:
                return record.seq
    return -1
