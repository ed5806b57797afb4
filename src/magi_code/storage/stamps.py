"""File stamps: telling, with one ``stat``, whether a file may have changed since a read.

A cache of something derived from files (parsed settings, the readiness of a selection)
stays valid exactly while every file it was derived from shows the same stamp: device,
inode, size, mode, owner, and the modification and status-change times in nanoseconds.
Replacing a file by rename gives a new inode; writing it in place moves ``st_mtime_ns``
and ``st_ctime_ns``; ``chmod``/``chown`` (which the auth store checks) move
``st_ctime_ns``; deleting it turns the stamp into :data:`ABSENT`.

The one gap is timestamp granularity: two in-place writes of the same size within one
clock tick of the file system can leave identical stamps. Like git's "racily clean"
rule, a set of stamps taken while any of them is younger than :data:`RACY_WINDOW_NS`
(measured against the clock just before the stamps were taken) must not be trusted:
:func:`trusted` says so, and callers re-read such files on every use until they have
been quiet for the window. A write after a trusted stamp always gets a later time than
the stamped one on any file system whose granularity is below the window (ext4, XFS,
Btrfs, tmpfs, APFS: nanoseconds or a scheduler tick; HFS+ and ext3: one second), so it
always changes the stamp.
"""

from __future__ import annotations

import os
from typing import Final

# (st_dev, st_ino, st_size, st_mode, st_uid, st_mtime_ns, st_ctime_ns); None when absent.
Stamp = tuple[int, int, int, int, int, int, int] | None

ABSENT: Final = None
# Files changed less than this before their stamps were taken are re-read on every use.
RACY_WINDOW_NS: Final = 2_000_000_000


def stamp(path: str, *, follow_symlinks: bool = True) -> Stamp:
    """The stamp of ``path``; :data:`ABSENT` when nothing is there.

    With ``follow_symlinks`` it is the stamp of what a read through the path would open
    (a dangling link is absent); without it, the stamp of the directory entry itself.

    Raises:
        OSError: anything but a missing entry (``ENOTDIR``, ``EACCES``, ``ELOOP``, ...):
            the caller cannot tell what a read would see and must not use a cache.
    """
    try:
        st = os.stat(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        return ABSENT
    return (st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_uid, st.st_mtime_ns, st.st_ctime_ns)


def trusted(stamps: tuple[Stamp, ...], taken_ns: int, window_ns: int = RACY_WINDOW_NS) -> bool:
    """Whether ``stamps``, taken right after the clock read ``taken_ns``, can vouch for the
    files' contents: none of them changed within ``window_ns`` before (or after, with a
    clock that moved back) that instant."""
    horizon = taken_ns - window_ns
    for item in stamps:
        if item is not None and (item[5] >= horizon or item[6] >= horizon):
            return False
    return True
