"""Where the read-only file tools do their work: on the event loop when that cannot block.

A worker thread per call costs more than the work of a typical ``read_file`` or
``list_files`` (~0.1 ms): about 0.13 ms of hand-offs alone, and several times that while
other threads want the interpreter lock, as a turn's own session writer does. So these
tools are written as *steps*: a generator that does the work and yields a marker where
the loop may take back control. ``run_steps`` runs them on the event loop for at most
``INLINE_SLICE_SECONDS`` and hands the rest to a worker thread, at once where a step says
it ``MAY_BLOCK``.

What may block is decided from the project's filesystem, once per turn and again after
any mount or unmount (``ProjectFiles``, in a worker thread; ``MountTable``): the project
root's mount must be of a local type (``storage.mounts``; never a network or FUSE
filesystem, where a system call can wait for a server), and a step yields ``MAY_BLOCK``
before it follows a symbolic link, crosses into another mount or leaves the project,
since any of those can lead anywhere. Without ``/proc/self/mountinfo`` nothing runs on
the loop. Steps yield a ``CHECKPOINT`` at least every few hundred directory entries or
thousand lines, so a slice ends on time.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Generator
from pathlib import Path
from stat import S_ISLNK
from typing import Final, TypeVar

from magi_code.dataclass import dataclass
from magi_code.storage.mounts import MOUNT_TABLE, contains, is_local, mounts_inside, read_mounts
from magi_code.tools.base import ToolContext
from magi_code.tools.paths import check_raw_path, project_root, resolve_in_project

_T = TypeVar("_T")

# How long steps run on the event loop before the rest goes to a worker thread.
INLINE_SLICE_SECONDS: Final = 0.002
SKIPPED_DIRS: Final = frozenset({".git"})
# Directory entries handled between two checkpoints of a walk.
WALK_STEP_ENTRIES: Final = 512


class Marker:
    """A point where steps may give back control (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


CHECKPOINT: Final = Marker("CHECKPOINT")  # a slice may end here
MAY_BLOCK: Final = Marker("MAY_BLOCK")  # what follows must not run on the event loop

Steps = Generator[Marker, None, _T]


async def run_steps(steps: Steps[_T], *, inline: bool) -> _T:
    """The result of ``steps``: on the event loop first when ``inline``, in a worker
    thread from its first ``MAY_BLOCK`` or the end of its slice (or from the start)."""
    if inline:
        deadline = time.monotonic() + INLINE_SLICE_SECONDS
        try:
            while next(steps) is CHECKPOINT and time.monotonic() < deadline:
                pass
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
    return await asyncio.to_thread(finish, steps)


def finish(steps: Steps[_T]) -> _T:
    """Run ``steps`` to their end here (a worker thread, or a test)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class ProjectFiles:
    """The project root as the file tools see it during one turn."""

    root: Path  # resolved
    inline: bool  # on a local filesystem: steps may run on the event loop
    mounts: frozenset[str]  # mount points inside the root
    generation: int = 0  # of the mount table it was read from (MountTable)

    def may_block(self, path: str) -> bool:
        """Whether entering ``path`` (a real path under the root) crosses a mount."""
        return path in self.mounts


def scan_project(project_dir: Path, generation: int = 0) -> ProjectFiles:
    """Resolve the root and read its mounts. Blocking: run it in a worker thread.

    Raises:
        ToolInputError: the project directory is not available.
    """
    root = project_root(project_dir)
    mounts = read_mounts()
    text = str(root)
    return ProjectFiles(root, is_local(mounts, text), mounts_inside(mounts, text), generation)


async def project_files(ctx: ToolContext) -> ProjectFiles:
    """The ``ProjectFiles`` of ``ctx``'s project, scanned by its first call (the context
    lives for one turn) and again after a mount or unmount anywhere."""
    generation = MOUNT_TABLE.generation()
    found = ctx.file_scans.get(ctx.project_dir)
    if found is None or found.generation != generation:
        # A failed scan (no project directory) is tried again by the next call.
        found = await asyncio.to_thread(scan_project, ctx.project_dir, generation)
        ctx.file_scans[ctx.project_dir] = found
    return found


def resolve_steps(files: ProjectFiles, raw: str) -> Steps[Path]:
    """The real path ``raw`` names, as ``paths.resolve_in_project``. Found here without
    following a link or crossing a mount; where it would, or cannot tell (``..``, a path
    outside the root), after ``MAY_BLOCK``, the full way."""
    check_raw_path(raw)
    root = str(files.root)
    candidate = os.path.normpath(os.path.join(root, raw))
    # (``normpath`` keeps a leading ``//``, which ``realpath`` does not.)
    if ".." not in raw.split("/") and contains(root, candidate) and candidate[:2] != "//":
        prefix = root
        for part in candidate[len(root) :].split("/"):
            if not part:
                continue
            prefix = f"{prefix.rstrip('/')}/{part}"
            if files.may_block(prefix):
                break
            try:
                mode = os.lstat(prefix).st_mode
            except OSError:
                return Path(candidate)  # the rest does not exist: the caller says so
            if S_ISLNK(mode):
                break
        else:
            return Path(candidate)
    yield MAY_BLOCK
    return resolve_in_project(files.root, raw)


Entry = tuple[str, bool]  # (relative posix path, is_dir)


def walk(
    files: ProjectFiles, base: Path, *, max_depth: int | None = None
) -> Generator[list[Entry] | Marker, None, None]:
    """The entries under ``base`` in batches, sorted per directory: a directory's entries
    (directories first), then each subdirectory's, depth first; and the markers of steps
    (a ``CHECKPOINT`` per directory and between batches, each at most
    ``WALK_STEP_ENTRIES``).

    Never follows directory symlinks (they are listed, not entered), skips ``.git`` and
    unreadable directories. Strings only (no ``Path`` per entry), handed over a directory
    at a time: a listing is on the tool loop's path.
    """
    # (directory, its relative prefix, depth), depth first: children pushed in reverse.
    pending: list[tuple[str, str, int]] = [(os.fspath(base), "", 0)]
    mounts = files.mounts
    while pending:
        top, prefix, depth = pending.pop()
        # (A mount on the way to ``base`` itself was seen by ``resolve_steps``.)
        if depth and files.may_block(top):
            yield MAY_BLOCK
        entries: list[os.DirEntry[str]] = []
        try:
            with os.scandir(top) as scan:
                for entry in scan:
                    entries.append(entry)
                    if len(entries) % WALK_STEP_ENTRIES == 0:
                        yield CHECKPOINT
        except OSError:
            continue
        yield CHECKPOINT
        dirs: list[str] = []
        files_here: list[str] = []
        links: set[str] = set()
        for start in range(0, len(entries), WALK_STEP_ENTRIES):
            if start:
                yield CHECKPOINT
            for entry in entries[start : start + WALK_STEP_ENTRIES]:
                name = entry.name
                try:
                    linked: bool | None = entry.is_symlink()
                except OSError:
                    linked = None  # unknown: still not followed as a link, but may block
                # Whether a link names a directory is asked of its target, which may be
                # anywhere; without the type in the directory itself, a mount point is
                # asked of the mount.
                if linked is not False or (mounts and os.path.join(top, name) in mounts):
                    yield MAY_BLOCK
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                if not is_dir:
                    files_here.append(name)
                elif name not in SKIPPED_DIRS:
                    dirs.append(name)
                    if linked:
                        links.add(name)
        dirs.sort()
        files_here.sort()
        listed = [(prefix + name, True) for name in dirs]
        listed += [(prefix + name, False) for name in files_here]
        if len(listed) <= WALK_STEP_ENTRIES:
            if listed:
                yield listed
        else:
            for start in range(0, len(listed), WALK_STEP_ENTRIES):
                yield listed[start : start + WALK_STEP_ENTRIES]
                yield CHECKPOINT
        if max_depth is None or depth < max_depth:
            pending += [
                (os.path.join(top, name), f"{prefix}{name}/", depth + 1)
                for name in reversed(dirs)
                if name not in links
            ]
