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
import threading
import time
from collections.abc import Collection, Generator, Sequence
from pathlib import Path
from stat import S_ISLNK
from typing import Final, TypeVar

from magi_code.dataclass import dataclass, field
from magi_code.storage.mounts import MOUNT_TABLE, contains, is_local, mounts_inside, read_mounts
from magi_code.storage.stamps import RACY_WINDOW_NS, Probe, probe, trusted
from magi_code.tools.base import CALL_BATCH, CallBatch, ToolContext
from magi_code.tools.paths import check_raw_path, project_root, resolve_in_project

_T = TypeVar("_T")

# How long steps run on the event loop before the rest goes to a worker thread.
INLINE_SLICE_SECONDS: Final = 0.002
SKIPPED_DIRS: Final = frozenset({".git"})
# Directory entries handled between two checkpoints of a walk.
WALK_STEP_ENTRIES: Final = 512
# Names a turn's ``DirectoryListings`` keeps at most (a few MiB), freed with the turn.
MAX_LISTED_NAMES: Final = 200_000
# Answers a turn's ``ListedAnswers`` keeps, and the entries one may have been made from.
MAX_ANSWERS: Final = 16
MAX_ANSWER_ENTRIES: Final = 10_000


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


# A directory's subdirectories and files, each sorted.
Listing = tuple[tuple[str, ...], tuple[str, ...]]
Entry = tuple[str, bool]  # (relative posix path, is_dir)
# What ``walk`` makes of a listing under a prefix: its entries, directories first, and the
# subdirectories to enter, as (path, their prefix), last first.
Walked = tuple[tuple[Entry, ...], tuple[tuple[str, str], ...]]


def entries_of(top: str, prefix: str, listing: Listing, links: Collection[str] = ()) -> Walked:
    """What ``walk`` makes of the listing of ``top`` (without the subdirectories that are
    symbolic links, ``links``) when its entries' paths begin with ``prefix``."""
    dirs, files_here = listing
    entries = tuple(
        [(prefix + name, True) for name in dirs] + [(prefix + name, False) for name in files_here]
    )
    subdirectories = tuple(
        [
            (os.path.join(top, name), f"{prefix}{name}/")
            for name in reversed(dirs)
            if name not in links
        ]
    )
    return entries, subdirectories


class DirectoryListings:
    """The directories ``walk`` read during one turn: their subdirectories and files,
    reused while one ``stat`` of the directory shows the stamp it had when it was read
    (``storage.stamps``: adding, removing or renaming an entry moves the directory's
    times). Reading a directory takes several system calls, and a tool-heavy turn lists
    the same few directories again and again. Within a ``CallBatch``, a listing read or
    checked since the batch began is reused without that ``stat``. What the walk made of
    a listing, under the last prefix it was walked with, is kept beside it.

    Only directories without symbolic links (whose target, not the directory, says what
    they are) and whose times were older than the racy window are kept. Entries are
    replaced whole, so a walk in a worker thread may share it with the event loop."""

    def __init__(self, racy_window_ns: int = RACY_WINDOW_NS) -> None:
        # path -> (its stamp, its listing, the batch that last read or checked it, and
        # what the walk last made of it: (prefix, walked))
        self._found: dict[str, tuple[Probe, Listing, CallBatch | None, tuple[str, Walked]]] = {}
        self._names = 0
        self._window = racy_window_ns

    def walked(self, path: str, prefix: str) -> Walked | None:
        """``entries_of`` the listing of ``path`` under ``prefix``, where still as read."""
        found = self._found.get(path)
        if found is None:
            return None
        stamp, listing, checked_in, made = found
        batch = CALL_BATCH.get()
        checked = batch is not None and checked_in is batch
        if checked and made[0] == prefix:
            return made[1]
        if not checked and not stamp.unchanged():
            return None
        if made[0] != prefix:
            walked = entries_of(path, prefix, listing)
            self._names += len(walked[0]) - len(made[1][0])
            made = (prefix, walked)
        self._found[path] = (stamp, listing, batch, made)
        return made[1]

    def put(
        self, path: str, stamp: Probe, taken_ns: int, listing: Listing, made: tuple[str, Walked]
    ) -> None:
        """Keep what was read of ``path`` after ``stamp`` was taken (at ``taken_ns``), and
        what the walk made of it (``(prefix, walked)``)."""
        if not trusted((stamp,), taken_ns, self._window) or self._names > MAX_LISTED_NAMES:
            return
        replaced = self._found.get(path)
        if replaced is not None:
            self._names -= sum(map(len, replaced[1])) + len(replaced[3][1][0])
        self._names += sum(map(len, listing)) + len(made[1][0])
        self._found[path] = (stamp, listing, CALL_BATCH.get(), made)


# A directory a walk visited: (path, prefix, what the walk made of it, or None where it
# could not be read).
Visited = tuple[str, str, Walked | None]


class ListedAnswers:
    """What ``list_files`` answered during one turn, by (directory, pattern), with the
    directories its walk visited.

    ``DirectoryListings.walked`` hands back the very tuple it keeps for as long as a
    directory is as it was read, and that tuple says which subdirectories the walk enters
    next. So while each directory the walk visited gives back the same tuple, object for
    object, a new walk would visit the same directories and find the same matches: the
    answer is reused without walking, matching, sorting and joining again (one
    ``walked`` per directory: a ``stat`` at most, as the walk does). A directory read
    again gives a new tuple, and the answer is made anew. Answers whose walk met an
    unreadable directory or a mount point are not kept. Keeps at most ``MAX_ANSWERS``,
    each made from at most ``MAX_ANSWER_ENTRIES`` entries; a walk in a worker thread may
    share it with the event loop."""

    def __init__(self) -> None:
        # key -> (the directories visited, the answer, the batch that last checked it)
        self._answers: dict[tuple[str, str], tuple[list[Visited], str, CallBatch | None]] = {}
        self._lock = threading.Lock()

    def answer(self, key: tuple[str, str], listings: DirectoryListings) -> str | None:
        """The answer kept for ``key`` if every directory its walk visited is unchanged;
        within a ``CallBatch``, one check stands for the batch's other calls."""
        found = self._answers.get(key)
        if found is None:
            return None
        visited, text, checked_in = found
        batch = CALL_BATCH.get()
        if batch is not None and checked_in is batch:
            return text
        for path, prefix, made in visited:
            if listings.walked(path, prefix) is not made:
                return None
        if batch is not None:
            with self._lock:
                if self._answers.get(key) is found:  # not replaced meanwhile
                    self._answers[key] = (visited, text, batch)
        return text

    def keep(
        self,
        key: tuple[str, str],
        files: ProjectFiles,
        visited: list[Visited],
        entries: int,
        text: str,
    ) -> None:
        if entries > MAX_ANSWER_ENTRIES or any(
            made is None or files.may_block(path) for path, _, made in visited
        ):
            return
        with self._lock:
            self._answers.pop(key, None)
            if len(self._answers) >= MAX_ANSWERS:
                del self._answers[next(iter(self._answers))]
            self._answers[key] = (visited, text, CALL_BATCH.get())


@dataclass(frozen=True, slots=True)
class ProjectFiles:
    """The project root as the file tools see it during one turn."""

    root: Path  # resolved
    inline: bool  # on a local filesystem: steps may run on the event loop
    mounts: frozenset[str]  # mount points inside the root
    generation: int = 0  # of the mount table it was read from (MountTable)
    listings: DirectoryListings = field(default_factory=DirectoryListings, compare=False)
    listed: ListedAnswers = field(default_factory=ListedAnswers, compare=False)

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
    lives for one turn) and again after a mount or unmount anywhere (the mount table
    polled once per ``CallBatch``)."""
    batch = CALL_BATCH.get()
    if batch is None:
        generation = MOUNT_TABLE.generation()
    elif batch.mount_generation is None:
        generation = batch.mount_generation = MOUNT_TABLE.generation()
    else:
        generation = batch.mount_generation
    found = ctx.file_scans.get(ctx.project_dir)
    if found is None or found.generation != generation:
        async with ctx.scanning:  # calls that start together wait for one scan
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
    if raw == ".":  # the usual default, and the root is resolved already
        return files.root
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


def walk(
    files: ProjectFiles,
    base: Path,
    *,
    max_depth: int | None = None,
    visited: list[Visited] | None = None,
) -> Generator[Sequence[Entry] | Marker, None, None]:
    """The entries under ``base`` in batches, sorted per directory: a directory's entries
    (directories first), then each subdirectory's, depth first; and the markers of steps
    (a ``CHECKPOINT`` per directory and between batches, each at most
    ``WALK_STEP_ENTRIES``).

    Never follows directory symlinks (they are listed, not entered), skips ``.git`` and
    unreadable directories. Strings only (no ``Path`` per entry), handed over a directory
    at a time: a listing is on the tool loop's path. Each directory visited is added to
    ``visited`` when one is given.
    """
    # (directory, its relative prefix, depth), depth first: children pushed in reverse.
    pending: list[tuple[str, str, int]] = [(os.fspath(base), "", 0)]
    while pending:
        top, prefix, depth = pending.pop()
        # (A mount on the way to ``base`` itself was seen by ``resolve_steps``.)
        if depth and files.may_block(top):
            yield MAY_BLOCK
        kept = files.listings.walked(top, prefix)
        if kept is None:
            kept = yield from _read_directory(files, top, prefix)
        else:
            yield CHECKPOINT
        if visited is not None:
            visited.append((top, prefix, kept))
        if kept is None:
            continue
        listed, subdirectories = kept
        if len(listed) <= WALK_STEP_ENTRIES:
            if listed:
                yield listed
        else:
            for start in range(0, len(listed), WALK_STEP_ENTRIES):
                yield listed[start : start + WALK_STEP_ENTRIES]
                yield CHECKPOINT
        if max_depth is None or depth < max_depth:
            depth += 1
            pending += [(path, under, depth) for path, under in subdirectories]


def _read_directory(
    files: ProjectFiles, top: str, prefix: str
) -> Generator[Marker, None, Walked | None]:
    """``walk``'s reading of one directory: its subdirectories (without ``.git`` and
    without entering symbolic links) and files, each sorted, as ``entries_of`` makes them
    under ``prefix``, or ``None`` where it cannot be read. Kept in ``files.listings``
    where that may be reused."""
    taken_ns = time.time_ns()
    try:
        stamp: Probe | None = probe(top, follow_symlinks=False)
    except OSError:
        stamp = None
    entries: list[os.DirEntry[str]] = []
    try:
        with os.scandir(top) as scan:
            for entry in scan:
                entries.append(entry)
                if len(entries) % WALK_STEP_ENTRIES == 0:
                    yield CHECKPOINT
    except OSError:
        return None
    yield CHECKPOINT
    mounts = files.mounts
    plain = True  # every entry's type is known from the directory itself
    links: set[str] = set()  # the subdirectories that are symbolic links
    dirs: list[str] = []
    files_here: list[str] = []
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
                plain = False
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
    listing = (tuple(sorted(dirs)), tuple(sorted(files_here)))
    walked = entries_of(top, prefix, listing, links)
    if plain and stamp is not None:
        files.listings.put(top, stamp, taken_ns, listing, (prefix, walked))
    return walked
