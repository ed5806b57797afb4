"""File checkpoints of a session, and what a rewind does with them (RFC-0002 §6.16).

Before a turn's tool changes a file, its old content is kept as a **blob** in the
session's own directory: ``ckpt-<sha256 of the content>`` (mode 0600, content-addressed,
so one content is kept once however often it recurs; not fsynced, and checked against
its name when read, so a blob a crash lost or tore only makes its file not restorable).
The change itself is a ``file_change`` history record (``records``): the project root,
the path in it, and the SHA-256 of the content before and after (``""``: no file).
Blobs go with the session (``SessionStore.remove`` unlinks every file of its directory).

Bounds per session: at most ``MAX_CHECKPOINT_BLOBS`` blobs and ``MAX_CHECKPOINT_BYTES``
bytes of them; saving one past either evicts the least recently saved first (saving a
content already kept makes it the most recent). A file over ``MAX_CHECKPOINT_FILE_BYTES``
is not kept at all. A rewind that needs a blob no longer kept reports that file
``not_restorable`` and leaves it alone.

A **rewind plan** (``plan_files``) compares each file the agent changed after the
rewind point with the disk now: as the agent last left it, it is restored to what it was
before the agent's first change after that point (``restore``); already like that,
``unchanged``; anything else was changed outside the agent since: ``conflict``, left
alone unless forced. Blocking file I/O throughout.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Literal

import orjson

from magi_code.dataclass import dataclass
from magi_code.sessions.fileio import DIR_FLAGS, FILE_MODE, NOFOLLOW, pread_all, write_all
from magi_code.sessions.records import Record, UnknownRecord
from magi_code.storage.files import atomic_write, open_regular

BLOB_PREFIX: Final = "ckpt-"
_TEMP_PREFIX: Final = ".ckpt-new-"
MAX_CHECKPOINT_BLOBS: Final = 1024
MAX_CHECKPOINT_BYTES: Final = 128 * 1024 * 1024
MAX_CHECKPOINT_FILE_BYTES: Final = 8 * 1024 * 1024
# No file: the digest a change names for a file that did not (or no longer) exist.
ABSENT: Final = ""
_CHUNK: Final = 1024 * 1024

FileState = Literal["restore", "unchanged", "conflict", "not_restorable"]


def digest(data: bytes | None) -> str:
    return ABSENT if data is None else hashlib.sha256(data).hexdigest()


class NotAFile(Exception):
    """The path names something a checkpoint never reads or writes (a directory, a
    symlink, a device): the change is not checkpointed."""


@dataclass(frozen=True, slots=True)
class Content:
    """A file as read for a checkpoint: its digest, and its bytes when they fit the
    per-file bound (``None`` for no file, or one too large to keep)."""

    digest: str
    data: bytes | None


def read_content(path: Path) -> Content:
    """The file at ``path`` now (never following a final symlink, never blocking on a
    special file). Raises :class:`NotAFile`; other OS errors as they come."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    except FileNotFoundError:
        return Content(ABSENT, None)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotAFile from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile
        if info.st_size <= MAX_CHECKPOINT_FILE_BYTES:
            data = pread_all(fd, info.st_size, 0)
            if len(data) <= MAX_CHECKPOINT_FILE_BYTES:
                return Content(digest(data), data)
        hasher = hashlib.sha256()
        offset = 0
        while chunk := os.pread(fd, _CHUNK, offset):
            hasher.update(chunk)
            offset += len(chunk)
        return Content(hasher.hexdigest(), None)
    finally:
        os.close(fd)


class Checkpoints:
    """The blobs of one session directory."""

    def __init__(self, session_dir: Path) -> None:
        self._dir = session_dir

    def save(self, data: bytes) -> str:
        """Keep ``data`` (at most ``MAX_CHECKPOINT_FILE_BYTES``) and return its digest;
        evicts the least recently saved blobs past the bounds. Raises OSError."""
        name = BLOB_PREFIX + digest(data)
        dir_fd = os.open(self._dir, DIR_FLAGS)
        try:
            try:
                os.utime(name, dir_fd=dir_fd, follow_symlinks=False)  # now the most recent
            except FileNotFoundError:
                temp = _TEMP_PREFIX + secrets.token_hex(8)
                fd = open_regular(
                    temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd, mode=FILE_MODE
                )
                try:
                    write_all(fd, data)
                finally:
                    os.close(fd)
                # Not fsynced: a blob a crash lost or tore fails its digest check on
                # load, and that file is reported not restorable; an edit never waits.
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            _evict(dir_fd, keep=name)
        finally:
            os.close(dir_fd)
        return name.removeprefix(BLOB_PREFIX)

    def load(self, content: str) -> bytes | None:
        """The blob of digest ``content`` (``None`` when not kept, or not intact)."""
        if not _is_digest(content):
            return None
        try:
            dir_fd = os.open(self._dir, DIR_FLAGS)
        except OSError:
            return None
        try:
            fd = open_regular(BLOB_PREFIX + content, os.O_RDONLY, dir_fd=dir_fd)
        except OSError:
            return None
        finally:
            os.close(dir_fd)
        try:
            size = os.fstat(fd).st_size
            data = pread_all(fd, min(size, MAX_CHECKPOINT_FILE_BYTES), 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if digest(data) == content else None

    def has(self, content: str) -> bool:
        """Whether a blob of digest ``content`` is kept (``load`` still checks it)."""
        if not _is_digest(content):
            return False
        try:
            info = os.stat(self._dir / (BLOB_PREFIX + content), follow_symlinks=False)
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(info.st_mode)

    def link_into(self, other_dir: Path, contents: Iterable[str]) -> None:
        """Share the blobs of ``contents`` with another session's directory (a fork), best
        effort: a blob not shared is one that session cannot restore."""
        try:
            src = os.open(self._dir, DIR_FLAGS)
        except OSError:
            return
        try:
            dst = os.open(other_dir, DIR_FLAGS)
            try:
                for content in set(contents) - {ABSENT}:
                    with contextlib.suppress(OSError):
                        name = BLOB_PREFIX + content
                        os.link(name, name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
            finally:
                os.close(dst)
        finally:
            os.close(src)


def _is_digest(content: str) -> bool:
    return len(content) == 64 and all(c in "0123456789abcdef" for c in content)


def _evict(dir_fd: int, keep: str) -> None:
    blobs: list[tuple[int, str, int]] = []
    for name in os.listdir(dir_fd):
        if name.startswith(BLOB_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                blobs.append((info.st_mtime_ns, name, info.st_size))
    blobs.sort()
    count, total = len(blobs), sum(size for _, _, size in blobs)
    for _, name, size in blobs:
        if count <= MAX_CHECKPOINT_BLOBS and total <= MAX_CHECKPOINT_BYTES:
            return
        if name == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        count, total = count - 1, total - size


@dataclass(frozen=True, slots=True)
class FileChange:
    """A ``file_change`` record's fields."""

    seq: int
    root: str
    path: str
    before: str
    after: str


def file_change_of(record: Record, line: bytes) -> FileChange | None:
    """The ``file_change`` a history line holds (``None`` for any other record)."""
    if not isinstance(record, UnknownRecord) or record.type != "file_change":
        return None
    obj = orjson.loads(line)  # decoded once already: valid JSON
    fields = [obj.get(name) for name in ("root", "path", "before", "after")]
    if not all(isinstance(value, str) for value in fields):
        return None
    root, path, before, after = (str(value) for value in fields)
    return FileChange(record.seq, root, path, before, after)


@dataclass(frozen=True, slots=True)
class PlannedFile:
    """One file a rewind would change back: where it is, what it becomes (``target``,
    a digest, ``""``: no file) and what the agent left there (``expected``)."""

    root: str
    path: str
    target: str
    expected: str
    state: FileState


def plan_files(changes: Iterable[FileChange], blobs: Checkpoints) -> list[PlannedFile]:
    """What a rewind to before ``changes`` (in seq order) does to each file, by the disk
    now; files in the order of their first change."""
    first: dict[tuple[str, str], FileChange] = {}
    last: dict[tuple[str, str], FileChange] = {}
    for change in changes:
        first.setdefault((change.root, change.path), change)
        last[(change.root, change.path)] = change
    planned = []
    for key, change in first.items():
        target, expected = change.before, last[key].after
        planned.append(
            PlannedFile(key[0], key[1], target, expected, _state(key, target, expected, blobs))
        )
    return planned


def _state(key: tuple[str, str], target: str, expected: str, blobs: Checkpoints) -> FileState:
    try:
        now = read_content(_target_path(*key)).digest
    except (NotAFile, OSError, ValueError):
        return "conflict"
    if now == target:
        return "unchanged"
    if now != expected:
        return "conflict"
    if target != ABSENT and not blobs.has(target):
        return "not_restorable"
    return "restore"


def _target_path(root: str, path: str) -> Path:
    """``root``/``path``, refusing a path that leaves the root (ValueError)."""
    base = Path(root)
    candidate = base / path
    if not base.is_absolute() or ".." in Path(path).parts or Path(path).is_absolute():
        raise ValueError("not a project path")
    real_parent = Path(os.path.realpath(candidate.parent))
    if real_parent != Path(os.path.realpath(base)) and not real_parent.is_relative_to(
        os.path.realpath(base)
    ):
        raise ValueError("outside the project")
    return real_parent / candidate.name


RestoreResult = Literal["restored", "unchanged", "conflict", "not_restorable", "failed"]


def restore(file: PlannedFile, blobs: Checkpoints, force: bool) -> RestoreResult:
    """Change ``file`` back, checking its state again first: only a file still as the
    agent left it (or, with ``force``, one changed since) is written."""
    state = _state((file.root, file.path), file.target, file.expected, blobs)
    if state == "unchanged" or state == "not_restorable":
        return state
    if state == "conflict" and not force:
        return "conflict"
    try:
        path = _target_path(file.root, file.path)
        if file.target == ABSENT:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    return "failed"
                os.unlink(path)
            return "restored"
        data = blobs.load(file.target)
        if data is None:
            return "not_restorable"
        try:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
        except FileNotFoundError:
            mode = 0o644
        atomic_write(path, data, mode)
    except (OSError, ValueError):
        return "failed"
    return "restored"
