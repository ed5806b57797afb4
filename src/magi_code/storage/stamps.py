"""File probes: telling, with one ``stat``, whether a read of a path could now see
something else than when the probe was taken.

A cache of something derived from files (parsed settings, the readiness of a selection)
stays valid exactly while every file it was derived from shows the same stamp: device,
inode, size, mode, owner, and the modification and status-change times in nanoseconds.
Replacing a file by rename gives a new inode; writing it in place moves ``st_mtime_ns``
and ``st_ctime_ns``; ``chmod``/``chown`` (which the auth store checks) move
``st_ctime_ns``; deleting it makes the ``stat`` fail. A missing file is probed through
its nearest existing ancestor directory instead, whose times move whenever an entry is
created or removed in it: the file (or the missing directory on the way to it) cannot
appear, not even appear and vanish again, without changing that directory's stamp.

The one gap is timestamp granularity: two in-place writes of the same size within one
clock tick of the file system can leave identical stamps. Like git's "racily clean"
rule, a set of probes taken while any of their stamps is younger than :data:`RACY_WINDOW_NS`
(measured against the clock just before the stamps were taken) must not be trusted:
:func:`trusted` says so, and callers re-read such files on every use until they have
been quiet for the window. A write after a trusted stamp always gets a later time than
the stamped one on any file system whose granularity is below the window (ext4, XFS,
Btrfs, tmpfs, APFS: nanoseconds or a scheduler tick; HFS+ and ext3: one second), so it
always changes the stamp.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final

from magi_code.dataclass import dataclass

# (st_dev, st_ino, st_size, st_mode, st_uid, st_mtime_ns, st_ctime_ns)
Stamp = tuple[int, int, int, int, int, int, int]

# Files changed less than this before their probes were taken are re-read on every use.
RACY_WINDOW_NS: Final = 2_000_000_000


def _of(st: os.stat_result) -> Stamp:
    return (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mode,
        st.st_uid,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )


@dataclass(frozen=True, slots=True)
class Probe:
    """What to ``stat`` later (the file, or the nearest existing ancestor of a missing
    one) and the stamp it had."""

    path: str
    follow_symlinks: bool
    stamp: Stamp

    def unchanged(self) -> bool:
        """One ``stat``: True only if it shows the same stamp."""
        try:
            return _of(os.stat(self.path, follow_symlinks=self.follow_symlinks)) == self.stamp
        except OSError:
            return False


def probe(path: str, *, follow_symlinks: bool = True) -> Probe:
    """A probe of ``path``.

    With ``follow_symlinks`` it stamps what a read through the path would open; without
    it, the directory entry itself. A missing path is probed through its nearest existing
    ancestor directory (always resolved through symlinks).

    Raises:
        OSError: anything but a plain missing entry (``ENOTDIR``, ``EACCES``, ``ELOOP``, a
            dangling symlink at the path or on the way to it, ...): the caller cannot tell
            from a probe what a read would see and must not cache anything read there.
    """
    try:
        return Probe(path, follow_symlinks, _of(os.stat(path, follow_symlinks=follow_symlinks)))
    except FileNotFoundError:
        pass
    current = path
    while True:
        # A dangling symlink: what it would point to lives elsewhere, unprobed.
        if follow_symlinks and os.access(current, os.F_OK, follow_symlinks=False):
            raise FileNotFoundError("a dangling symlink is on the way to the file")
        follow_symlinks = True
        parent = os.path.dirname(current)
        if parent == current:
            raise FileNotFoundError("no existing ancestor")
        current = parent
        try:
            return Probe(current, True, _of(os.stat(current)))
        except FileNotFoundError:
            continue


def trusted(probes: Iterable[Probe], taken_ns: int, window_ns: int = RACY_WINDOW_NS) -> bool:
    """Whether ``probes``, taken right after the clock read ``taken_ns``, can vouch for
    what was read: none of their stamps changed within ``window_ns`` before (or after,
    with a clock that moved back) that instant."""
    horizon = taken_ns - window_ns
    return all(p.stamp[5] < horizon and p.stamp[6] < horizon for p in probes)
