"""Which filesystem a path is on, from ``/proc/self/mountinfo``, and whether it is local.

A system call on a network or FUSE filesystem can wait for a server, for good when the
server is gone; on a local one it waits for local storage at most. Code that would do
file work on the event loop asks here first (``tools.inline``, ``auth.readiness``,
``sessions.store``): only paths on a filesystem of a ``LOCAL_TYPES`` type qualify. Without
``/proc/self/mountinfo`` (not Linux, or no procfs) ``read_mounts`` answers ``None`` and
each caller says what that means for it. ``MOUNT_TABLE`` tells when the table changed.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterable
from typing import Final

# Filesystems whose system calls do not wait for anything but local storage.
LOCAL_TYPES: Final = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "tmpfs", "ramfs"}
    | {"overlay", "jfs", "reiserfs", "vfat", "exfat"}
)
MOUNTINFO: Final = "/proc/self/mountinfo"

Mount = tuple[str, str]  # (mount point, filesystem type)


def read_mounts() -> list[Mount] | None:
    """The mount table, in mount order; ``None`` without one. Reads procfs only."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as fh:
            return list(_mount_points(fh))
    except OSError:
        return None


def is_local(mounts: list[Mount] | None, real_path: str) -> bool:
    """Whether ``real_path`` (symlinks resolved) is on a local filesystem: that of the
    longest mount point above it, the last of those listed (a mount stacked on the same
    point hides the ones before it)."""
    owner: Mount | None = None
    for mount in mounts or ():
        if contains(mount[0], real_path) and (owner is None or len(mount[0]) >= len(owner[0])):
            owner = mount
    return owner is not None and owner[1] in LOCAL_TYPES


def local_lookup(mounts: list[Mount], path: str) -> bool:
    """Whether looking ``path`` up stays on local filesystems: no symbolic link on the way
    (a link can be pointed elsewhere without a mount changing), and ``path`` and every
    directory above it on a local filesystem. Blocking: resolves the path."""
    path = os.path.abspath(path)
    if os.path.realpath(path) != path:
        return False
    while True:
        if not is_local(mounts, path):
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def mounts_inside(mounts: list[Mount] | None, real_path: str) -> frozenset[str]:
    """The mount points strictly under ``real_path``."""
    return frozenset(
        point for point, _ in mounts or () if point != real_path and contains(real_path, point)
    )


def contains(parent: str, path: str) -> bool:
    """Whether ``path`` is ``parent`` or under it (both real, absolute)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _mount_points(lines: Iterable[str]) -> Iterable[Mount]:
    for line in lines:
        fields = line.split()
        try:
            separator = fields.index("-", 6)
            point, kind = fields[4], fields[separator + 1]
        except (ValueError, IndexError):
            continue
        # Spaces, tabs, newlines and backslashes in a mount point are octal escapes.
        yield _unescape(point), kind


def _unescape(field: str) -> str:
    if "\\" not in field:
        return field
    return (
        field.encode("utf-8", "surrogateescape")
        .decode("unicode_escape")
        .encode("latin-1")
        .decode("utf-8", "surrogateescape")
    )


class MountTable:
    """Counts changes of this process's mount table: ``poll`` on an open
    ``/proc/self/mountinfo`` reports ``POLLPRI`` once after each mount or unmount (the poll
    itself takes the event; nothing needs to be read). Its one file descriptor is opened
    by the first call and kept; procfs never waits for a filesystem. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._poller: select.poll | None = None
        self._generation = 0

    def generation(self) -> int:
        with self._lock:
            return self._current()

    def _current(self) -> int:
        if self._poller is None:
            self._poller = select.poll()
            try:
                self._fd = os.open(MOUNTINFO, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass  # no mountinfo: nothing to watch, the table never changes (tried once)
            else:
                self._poller.register(self._fd, select.POLLPRI | select.POLLERR)
        if self._poller.poll(0):
            self._generation += 1
        return self._generation


MOUNT_TABLE: Final = MountTable()
