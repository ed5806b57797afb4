"""Durable session store: layout, writer leases, appends, listing, replay and turn outcomes.

Theory of operation
-------------------
Each session is one directory ``<sessions_dir>/<session_id>/`` holding::

    history.jsonl  append-only records (see ``records``), one compact JSON object a line
    append.lock    flock: exclusive around each append/repair, shared around each read
    lease.lock     flock: exclusive service writer lease, held while a service is attached
    meta.json      optional sidecar: title, project directory, archived flag (``meta``)

Locks are ``fcntl.flock`` on files opened with ``O_NOFOLLOW``; the kernel drops them when
the holding process dies, so a crashed (even ``kill -9``) holder never blocks others. Lock
files are never unlinked (their inode is the mutex). All file access goes through a
directory fd opened with ``O_NOFOLLOW`` after the ID has been validated, so an ID never
resolves outside its own directory.

Durability: a new session is built under a hidden ``.new-<id>`` directory, fsynced and
renamed into place (the parent is fsynced), so a listed session always has its header.
Appends are group-committed (``commit``): records queued while a batch is being written
and fsynced go out together as the next batch, one ``write()`` on an ``O_APPEND`` fd and
one fsync, and each record is reported durable only after the fsync that covers it. A
crash can only leave a torn last line; readers skip it (``gap``) and the next lease
holder truncates it before appending.

``session.list`` reuses the sorted result of its last directory scan while the
directory's ``fstat`` is unchanged (``listing.SessionIndex``, one per store).

Turn outcomes (``turn_outcome``, ``find_turn_by_key``) scan the whole history, not only the
replay window, so a restarted daemon can answer for any turn; ``close_interrupted_turn``
gives a turn whose process died mid-turn its ``failed`` terminal record, and
``close_last_interrupted_turn`` does so for the latest turn when a service takes the lease.

Every method is blocking file I/O; async callers run it in a worker thread (the lease's
``submit``, ``durable``, ``append_async`` and ``enqueue`` never block).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.idempotency import valid_idempotency_key
from magi_code.protocol.limits import MAX_ID_BYTES, MAX_SESSION_REPLAY_WINDOW_BYTES
from magi_code.sessions.checkpoints import Checkpoints, file_change_of
from magi_code.sessions.commit import CommitQueue
from magi_code.sessions.fileio import (
    APPEND_LOCK,
    DIR_FLAGS,
    DIR_MODE,
    FILE_MODE,
    HISTORY,
    LEASE_LOCK,
    META,
    NEW_PREFIX,
    REMOVING_PREFIX,
    ROOT_DIR_FLAGS,
    close_all,
    complete_prefix,
    flock_wait,
    holding,
    last_valid_seq,
    pread_all,
    repair_torn_tail,
    unavailable,
    write_all,
)
from magi_code.sessions.ids import is_session_id, new_session_id, validate_session_id
from magi_code.sessions.listing import (
    LibraryQuery,
    SessionIndex,
    check_page_limit,
    library_item,
    library_page,
    list_sessions,
)
from magi_code.sessions.meta import encode_meta, read_meta, update_meta
from magi_code.sessions.outcomes import TurnOutcome, scan_turn
from magi_code.sessions.projection import (
    History,
    Item,
    ParsedWindow,
    Projection,
    build_page,
    checkpoint_tail,
    context_tail,
    effective,
    extend_window,
    history_after,
    latest_compaction,
    parse_window,
    project,
    records_backward,
    resolve_cursor,
    window_omits_history,
)
from magi_code.sessions.queue import QueueEntry, read_queue, update_queue
from magi_code.sessions.records import (
    AssistantRecord,
    Record,
    RewindRecord,
    TerminalRecord,
    ToolCallRecord,
    ToolResultRecord,
    UnknownRecord,
    UserRecord,
    decode_line,
    encode_record,
    now_rfc3339,
)
from magi_code.sessions.titles import sanitize_title, title_from_prompt
from magi_code.storage.files import open_regular

# One record line; larger records would crowd the replay window (tools must bound output).
MAX_APPEND_RECORD_BYTES: Final = 1024 * 1024
# Replay holds the shared append lock only briefly; appends wait longer for readers.
REPLAY_LOCK_WAIT: Final = 0.05
WRITER_LOCK_WAIT: Final = 5.0
# What taking a lease reads first to find the latest turn (many turns of most sessions).
LATEST_TURN_BYTES: Final = 64 * 1024
# What a turn's start reads from the end of an uncached window, each in turn, to find the
# latest compaction checkpoint and the lines after its cutoff, before the whole window:
# soon after a compaction, and later in a long one.
CONTEXT_READS: Final = (64 * 1024, 512 * 1024)
# A lease just released can still look held for a moment: a process this one is spawning
# (a tool, the sandbox probe) holds a copy of every descriptor until it closes them on
# exec. Taking a lease waits this long for that before it reports the session busy.
LEASE_WAIT: Final = 0.25
# How often ``remove`` empties a directory that an opener racing it refilled.
REMOVE_ATTEMPTS: Final = 3
# A ``.new-<id>`` staging directory this old is a create that a crash cut short: a create
# takes well under a second (a fork's copy of a 2 MiB window included).
STALE_STAGING_SECONDS: Final = 3600
# A session's sidecar names at most this many of its forks (the latest).
MAX_FORK_LINKS: Final = 64

ContextRecord = UserRecord | AssistantRecord | ToolCallRecord | ToolResultRecord | TerminalRecord
_CONTEXT_TYPES: Final = (
    UserRecord,
    AssistantRecord,
    ToolCallRecord,
    ToolResultRecord,
    TerminalRecord,
)


_CacheKey = tuple[int, int, int, int]
_Parsed = tuple[ParsedWindow, Projection | None]


def _cache_key(info: os.stat_result) -> _CacheKey:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _window_start(size: int) -> int:
    """Where the replay window of a history of ``size`` bytes starts: one byte before its
    budget, which tells whether the budget starts on a line boundary."""
    return max(0, size - MAX_SESSION_REPLAY_WINDOW_BYTES - 1)


def _context_bytes(fd: int, size: int, start: int) -> tuple[bytes, int, bool]:
    """What a turn's context needs of the window of ``start`` to ``size``: the bytes from
    the newline before the latest compaction checkpoint's cutoff (found by
    ``checkpoint_tail``) in the shortest of :data:`CONTEXT_READS` that holds them, or the
    whole window. Returns the bytes, their file offset and whether they are the window."""
    for span in CONTEXT_READS:
        if size - start <= span:
            break
        data = pread_all(fd, span, size - span)
        tail = checkpoint_tail(data)
        if tail is not None:
            return data[tail - 1 :], size - span + tail - 1, False
        del data  # before the next, longer read
    data = pread_all(fd, size - start, start)
    tail = checkpoint_tail(data)
    if tail is None:
        return data, start, True
    return data[tail - 1 :], start + tail - 1, False


def _appended(fd: int, info: os.stat_result, key: _CacheKey, window: ParsedWindow) -> bytes | None:
    """The bytes appended to the file ``window`` was parsed from, or ``None`` where it
    is another file, did not grow, or no longer ends ``window`` with its last line."""
    end, last = window.end, window.last_line
    if key[:2] != (info.st_dev, info.st_ino) or info.st_size <= end or window.gap:
        return None
    if pread_all(fd, len(last) + 1, end - len(last) - 1) != last + b"\n":
        return None
    return pread_all(fd, info.st_size - end, end)


def _replay_arguments(
    session_id: object, after: object, limit: object
) -> tuple[str, str | None, int]:
    """A replay's session name, cursor and page limit (see ``SessionStore.replay``)."""
    name = validate_session_id(session_id)
    page_limit = check_page_limit(limit)
    if after is not None and (
        not isinstance(after, str) or len(after.encode("utf-8", "replace")) > MAX_ID_BYTES
    ):
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    return name, after, page_limit


def _page(
    name: str, window: ParsedWindow, projection: Projection, after: str | None, limit: int
) -> dict[str, object]:
    gap = window.gap or window_omits_history(window, window.compaction)
    return build_page(name, projection, after, limit, gap)


class _WindowCache:
    """A few recently parsed windows; used from worker threads, hence the lock, held only
    for a dictionary operation.

    At most :data:`CAPACITY` windows covering at most :data:`CAPACITY_BYTES` of history
    (the least recently used go first, the one just stored stays whatever its size): a
    window is up to 2 MiB of history, parsed and projected it takes about 3.3 times that
    in memory, and a daemon's sessions only grow, so a cache bounded by count alone would
    grow with them to 8 full windows (~50 MiB).
    """

    CAPACITY: Final = 8
    CAPACITY_BYTES: Final = 4 * 1024 * 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[_CacheKey, _Parsed]] = OrderedDict()
        self._bytes = 0

    def latest(self, session_id: str) -> tuple[_CacheKey, _Parsed] | None:
        """The session's entry, whatever the file it described has become since."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                self._entries.move_to_end(session_id)
            return entry

    def put(self, session_id: str, key: _CacheKey, parsed: _Parsed) -> None:
        with self._lock:
            self._drop(session_id)
            self._entries[session_id] = (key, parsed)
            self._bytes += _covered(parsed[0])
            while len(self._entries) > 1 and (
                len(self._entries) > self.CAPACITY or self._bytes > self.CAPACITY_BYTES
            ):
                self._drop(next(iter(self._entries)))

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._bytes -= _covered(entry[1][0])


def _covered(window: ParsedWindow) -> int:
    """The history bytes a parsed window covers (from its first record to its end)."""
    return window.end - window.starts[0] if window.starts else 0


class ForeignEntries(PermissionError):
    """What ``SessionStore.remove`` leaves alone: a session directory, or an entry in it,
    that another user owns, or a directory (the store never makes one there)."""


class StaleCursor(Exception):
    """A fork or rewind cursor that does not match the session's replay projection."""


class NotTurnBoundary(Exception):
    """A fork or rewind cursor that names an item inside a turn (not its terminal)."""


@dataclass(frozen=True, slots=True)
class Transcript:
    """One snapshot of a session's replay window: ``items`` are exactly what
    ``session.replay`` pages through (summary, messages, terminals); ``records`` are the
    window's records after the compaction cutoff, tool calls and results included;
    ``gap`` is the replay pages' flag (lines skipped, or history before the window)."""

    items: tuple[Item, ...]
    records: tuple[Record, ...]
    gap: bool

    def conversation(self) -> Iterator[Item | tuple[ToolCallRecord, bool | None]]:
        """The items in order with each tool call where it happened (before the first
        item after it), as ``(call, is_error)``: its result's flag, None when it has no
        result (its turn ended first)."""
        results: dict[tuple[str, str], bool | None] = {
            (r.turn_id, r.call_id): r.is_error
            for r in self.records
            if isinstance(r, ToolResultRecord)
        }
        calls = [r for r in self.records if isinstance(r, ToolCallRecord)]
        for item in self.items:
            if item.kind != "summary":
                # Calls made before this item; the empty part that ends a reply a call
                # interrupted carries the call's own seq and comes first.
                while calls and calls[0].seq < item.seq:
                    call = calls.pop(0)
                    yield call, results.get((call.turn_id, call.call_id))
            yield item
        for call in calls:
            yield call, results.get((call.turn_id, call.call_id))


@dataclass(frozen=True, slots=True)
class ContextRecords:
    """The user/assistant/tool/terminal records among ``records[first:]``, read in place.

    A turn's context is as long as its conversation, and a copy of it made for every turn
    was one of the allocations that grew with each turn and left the C heap scattered
    (``docs/unix-daemon.md``). ``records`` is a parsed window's list, which is never
    changed once parsed (``extend_window`` copies it). Iterate it as often as needed.
    """

    records: Sequence[Record]
    first: int

    def __iter__(self) -> Iterator[ContextRecord]:
        records = self.records
        for index in range(self.first, len(records)):
            record = records[index]
            if isinstance(record, _CONTEXT_TYPES):
                yield record


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a turn needs to rebuild the conversation.

    ``records`` are the user/assistant/tool/terminal records after the latest compaction
    cutoff (all of them when there is no checkpoint), in ``seq`` order, from the recent
    replay window. ``history_cut`` means records the conversation needs lie before that
    window; ``gap`` means torn or malformed lines were skipped among those read (from the
    checkpoint's cutoff on, when the window was parsed only from there).
    """

    summary: str | None
    cutoff_seq: int | None
    records: ContextRecords
    history_cut: bool
    gap: bool


def _latest_turn(records: Iterable[Record]) -> tuple[str, bool] | None:
    """The latest turn among ``records`` (the last first): its ID and whether its
    terminal follows; None when none starts there."""
    ended: set[str] = set()
    for record in records:
        if isinstance(record, TerminalRecord):
            ended.add(record.turn_id)
        elif isinstance(record, UserRecord):
            return record.turn_id, record.turn_id in ended
    return None


def _removable_entries(dir_fd: int) -> list[str]:
    """The names in a session directory, once it and each of them is this user's and
    none is a directory (``ForeignEntries`` otherwise)."""
    uid = os.geteuid()
    if os.fstat(dir_fd).st_uid != uid:
        raise ForeignEntries("not this user's session")
    names = os.listdir(dir_fd)
    for entry in names:
        try:
            info = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:  # another remover's unlink
            continue
        if info.st_uid != uid or stat.S_ISDIR(info.st_mode):
            raise ForeignEntries("not this user's file")
    return names


def _remove_directory(root_fd: int, name: str) -> None:
    """Unlink every entry of ``root_fd``'s ``name`` (each checked again), then the
    directory; a process that opened it before the rename may still create its lock
    files in it meanwhile, so an emptied directory that is not empty is emptied again.
    One that another remover finished meanwhile (``remove_leftovers``) is removed."""
    for attempt in range(REMOVE_ATTEMPTS):
        try:
            dir_fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            return
        try:
            for entry in _removable_entries(dir_fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        try:
            os.rmdir(name, dir_fd=root_fd)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY or attempt == REMOVE_ATTEMPTS - 1:
                raise


def remove_leftovers(sessions_dir: Path) -> int:
    """Remove from ``sessions_dir`` what crashes left there, which no session ID reaches
    and ``magi-code sessions rm`` therefore cannot: every ``.rm-<id>`` directory (a
    removal that had begun under the session's lease) and every ``.new-<id>`` directory
    older than :data:`STALE_STAGING_SECONDS` (a create). Each is emptied as ``remove``
    empties a session; one that is not this user's or holds a directory is left alone,
    as is one that cannot be removed. Returns how many went. Blocking."""
    try:
        root_fd = os.open(sessions_dir, ROOT_DIR_FLAGS)
    except OSError:  # no sessions yet, or none this user can read
        return 0
    try:
        with os.scandir(root_fd) as entries:
            names = [entry.name for entry in entries if _leftover(entry.name)]
        staged_before = time.time() - STALE_STAGING_SECONDS
        return sum(_remove_leftover(root_fd, name, staged_before) for name in names)
    except OSError:  # the directory could not be read
        return 0
    finally:
        os.close(root_fd)


def _remove_leftover(root_fd: int, name: str, staged_before: float) -> bool:
    try:
        staged = name.startswith(NEW_PREFIX)
        if staged and os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mtime > staged_before:
            return False  # a create may still be writing it
        # Opened as a directory, never followed; its owner and entries checked.
        _remove_directory(root_fd, name)
    except OSError:  # not a directory, ``ForeignEntries``, ...
        return False
    return True


def _leftover(name: str) -> bool:
    for prefix in (NEW_PREFIX, REMOVING_PREFIX):
        if name.startswith(prefix):
            return is_session_id(name.removeprefix(prefix))
    return False


class WriterLease:
    """The exclusive right to append to one session, held until ``release()``.

    Appends are group-committed (``commit.CommitQueue``): ``submit`` queues a record and
    returns its ``seq`` at once; it is durable once ``durable_seq`` reaches it, which
    ``wait_durable`` / ``durable`` wait for. ``append`` and ``append_async`` do both.
    Records are written in ``seq`` order; a record is reported durable only after the
    fsync that covers it. Thread-safe.

    After a failed batch the lease is unusable (every later submit raises
    ``SESSION_UNAVAILABLE``): release it and acquire a new one, which repairs the tail.
    """

    # How far a writer that does not wait for each record (``enqueue``) may run ahead of
    # durability: a turn's events wait for its records, and its event queue is bounded.
    MAX_PENDING_RECORDS: Final = 64
    MAX_PENDING_BYTES: Final = 4 * 1024 * 1024

    def __init__(
        self,
        session_id: str,
        session_dir: Path,
        fds: tuple[int, int, int],
        next_seq: int,
        has_title: bool,
        executor: Executor,
    ) -> None:
        self.session_id = session_id
        self._session_dir = session_dir
        self._lease_fd, lock_fd, history_fd = fds
        self._fds = [self._lease_fd, lock_fd, history_fd]
        self._commit = CommitQueue(history_fd, lock_fd, next_seq - 1, executor, WRITER_LOCK_WAIT)
        self._has_title = has_title
        self._mutex = threading.Lock()
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    @property
    def submitted_seq(self) -> int:
        """The seq of the last record submitted (before any: the last one in the file)."""
        return self._commit.submitted

    @property
    def durable_seq(self) -> int:
        """Every record up to this seq is durable."""
        return self._commit.durable

    @property
    def batches(self) -> int:
        """How many batches (write + fsync) this lease has flushed."""
        return self._commit.batches

    def submit(self, record: Mapping[str, object]) -> int:
        """Queue one record for the next group commit and return its ``seq`` (no I/O).

        ``record`` holds ``type`` and that type's fields (``v``/``seq``/``ts`` are
        assigned here). It is not durable yet: see ``wait_durable`` / ``durable``.

        Raises:
            ValueError: a header, an unknown type or invalid fields (a caller bug).
            ServiceError: ``LIMIT_EXCEEDED`` for a record over ``MAX_APPEND_RECORD_BYTES``;
                ``SESSION_UNAVAILABLE`` after release or after a failed batch.
        """
        if record.get("type") == "header":
            raise ValueError("the header is written by create()")
        if self._released:
            raise unavailable()

        def encode(seq: int) -> bytes:
            line = encode_record(record, seq, now_rfc3339())
            if len(line) > MAX_APPEND_RECORD_BYTES:
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
            return line

        hook = None
        if not self._has_title and record.get("type") == "user":
            text = str(record.get("text", ""))
            hook = lambda: self._write_title(text)  # noqa: E731 - runs after the fsync
        return self._commit.submit(encode, hook)

    def wait_durable(self, seq: int) -> None:
        """Block until record ``seq`` is durable (at once if it already is).

        Raises:
            ServiceError: ``SESSION_BUSY`` if its batch could not take the append lock
                within 5 s; ``SESSION_UNAVAILABLE`` if its batch's write or fsync failed,
                or an earlier batch failed.
        """
        self._commit.wait(seq)

    async def durable(self, seq: int) -> None:
        """``wait_durable`` without blocking the event loop."""
        await self._commit.wait_async(seq)

    def append(self, record: Mapping[str, object]) -> int:
        """Durably append one record and return its ``seq`` (blocking; ``submit`` +
        ``wait_durable``). Raises as those two."""
        seq = self.submit(record)
        self.wait_durable(seq)
        return seq

    async def append_async(self, record: Mapping[str, object]) -> int:
        """``append`` for an event loop: the record is durable when this returns."""
        seq = self.submit(record)
        await self.durable(seq)
        return seq

    async def enqueue(self, record: Mapping[str, object]) -> int:
        """``submit``, then wait only while the lease runs too far ahead of durability:
        until at most ``MAX_PENDING_RECORDS`` records, and at most ``MAX_PENDING_BYTES``
        (else: all of them), are not durable yet.

        For a writer that waits for durability elsewhere (before it releases what
        depends on the record). Raises as ``submit`` and, when it waits, as ``durable``.
        """
        seq = self.submit(record)
        if self._commit.pending_bytes > self.MAX_PENDING_BYTES:
            await self.durable(seq)
        elif seq - self._commit.durable > self.MAX_PENDING_RECORDS:
            await self.durable(seq - self.MAX_PENDING_RECORDS)
        return seq

    def _write_title(self, text: str) -> None:
        if self._has_title:
            return
        title = title_from_prompt(text)
        if title is None:
            return

        def first_title(meta: dict[str, object]) -> dict[str, object] | None:
            return None if meta.get("title") is not None else {**meta, "title": title}

        # Best effort: a title is optional display metadata and must never fail a turn.
        with contextlib.suppress(OSError, ServiceError):
            dir_fd = os.open(self._session_dir, DIR_FLAGS)
            try:
                update_meta(self._session_dir, dir_fd, first_title)
            finally:
                os.close(dir_fd)
            self._has_title = True

    def release(self) -> None:
        """Drop the lease (idempotent; blocking). Records already submitted are written
        first; closing the lease fd releases the flock."""
        with self._mutex:
            if self._released:
                return
            self._released = True
        self._commit.close()
        close_all(self._fds)

    def __enter__(self) -> WriterLease:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class SessionStore:
    """Session histories under ``sessions_dir`` (``$MC_HOME/sessions``)."""

    # Flushes of different sessions run in parallel on these threads (created on demand).
    COMMIT_THREADS: Final = 16

    def __init__(self, sessions_dir: Path) -> None:
        self._root = sessions_dir
        self._cache = _WindowCache()
        self._index = SessionIndex()
        self._committer = ThreadPoolExecutor(
            self.COMMIT_THREADS, thread_name_prefix="mc-session-commit"
        )

    def create(self, project_dir: Path | None = None) -> str:
        """Create a session with its header durably written and return its new ID;
        ``project_dir`` (the creating client's launch directory) is recorded in its
        sidecar, symlinks resolved.

        Raises:
            ServiceError: ``SESSION_UNAVAILABLE`` when the store cannot be written.
        """
        try:
            self._root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            for _ in range(8):
                session_id = new_session_id()
                if not os.path.lexists(self._root / session_id):
                    self._build(session_id, project_dir)
                    return session_id
        except OSError:
            raise unavailable() from None
        raise unavailable()

    def _build(
        self,
        session_id: str,
        project_dir: Path | None,
        meta: Mapping[str, object] | None = None,
        body: bytes = b"",
    ) -> None:
        """Write a new session: its header, then ``body`` (whole history lines: a fork's),
        and its sidecar with ``meta`` besides the project directory."""
        staging = self._root / (NEW_PREFIX + session_id)
        os.mkdir(staging, DIR_MODE)
        has_meta = project_dir is not None or bool(meta)
        files = (LEASE_LOCK, APPEND_LOCK, HISTORY, *((META,) if has_meta else ()))
        try:
            dir_fd = os.open(staging, DIR_FLAGS)
            try:
                created = now_rfc3339()
                header = {"type": "header", "session_id": session_id, "created_at": created}
                contents = {HISTORY: encode_record(header, 0, created) + body}
                if has_meta:
                    sidecar = dict(meta or {})
                    if project_dir is not None:
                        sidecar["project_dir"] = os.path.realpath(project_dir)
                    contents[META] = encode_meta(sidecar)
                for name in files:
                    fd = open_regular(
                        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=dir_fd, mode=FILE_MODE
                    )
                    try:
                        if name in contents:
                            write_all(fd, contents[name])
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            os.rename(staging, self._root / session_id)
        except BaseException:
            for name in files:
                with contextlib.suppress(OSError):
                    os.unlink(staging / name)
            with contextlib.suppress(OSError):
                os.rmdir(staging)
            raise
        root_fd = os.open(self._root, ROOT_DIR_FLAGS)
        try:
            os.fsync(root_fd)
        finally:
            os.close(root_fd)

    def _open_dir(self, session_id: object) -> int:
        name = validate_session_id(session_id)
        try:
            return os.open(self._root / name, DIR_FLAGS)
        except OSError:
            raise unavailable() from None

    def exists(self, session_id: object) -> bool:
        """Whether a session with a history file exists (``INVALID_SESSION_ID`` if unsafe)."""
        name = validate_session_id(session_id)
        try:
            dir_fd = os.open(self._root / name, DIR_FLAGS)
        except OSError:
            return False
        try:
            info = os.stat(HISTORY, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return False
        finally:
            os.close(dir_fd)
        return stat.S_ISREG(info.st_mode)

    def acquire_writer_lease(self, session_id: object) -> WriterLease:
        """Take the exclusive, cross-process writer lease of an existing session.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` if the session is
                missing or unreadable; ``SESSION_BUSY`` if another holder (any process, or
                another lease in this one) has it.
        """
        name = validate_session_id(session_id)
        dir_fd = self._open_dir(name)
        fds: list[int] = []
        try:
            lease_fd = open_regular(
                LEASE_LOCK, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd, mode=FILE_MODE
            )
            fds.append(lease_fd)
            flock_wait(lease_fd, fcntl.LOCK_EX, LEASE_WAIT)
            lock_fd = open_regular(
                APPEND_LOCK, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd, mode=FILE_MODE
            )
            fds.append(lock_fd)
            history_fd = open_regular(HISTORY, os.O_RDWR | os.O_APPEND, dir_fd=dir_fd)
            fds.append(history_fd)
            with holding(lock_fd, fcntl.LOCK_EX, WRITER_LOCK_WAIT):
                repair_torn_tail(history_fd)
                next_seq = last_valid_seq(history_fd) + 1
            has_title = read_meta(dir_fd)[0].get("title") is not None
        except ServiceError:
            close_all(fds)
            raise
        except OSError:
            close_all(fds)
            raise unavailable() from None
        finally:
            os.close(dir_fd)
        return WriterLease(
            name,
            self._root / name,
            (lease_fd, lock_fd, history_fd),
            next_seq,
            has_title,
            self._committer,
        )

    def _window_bytes(
        self, session_id: str, wait: float, tail: int | None = None
    ) -> tuple[bytes, int]:
        """The replay window's bytes (its last ``tail`` bytes at most) and the file offset
        they start at, read under a shared append lock (never creates files)."""
        try:
            with (
                self._history(session_id) as (lock_fd, history_fd),
                holding(lock_fd, fcntl.LOCK_SH, wait),
            ):
                size = os.fstat(history_fd).st_size
                start = (
                    _window_start(size) if tail is None else max(_window_start(size), size - tail)
                )
                return pread_all(history_fd, size - start, start), start
        except OSError:
            raise unavailable() from None

    def _window_and_projection(
        self, session_id: str, wait: float, *, with_projection: bool, context: bool = False
    ) -> tuple[ParsedWindow, Projection | None]:
        """The parsed window (and its projection), reused while the file is unchanged.

        A replay pages through one snapshot with many requests; the history file only
        grows (or is truncated by a torn-tail repair), so its identity, size and mtime
        say whether an earlier parse still describes it. While a turn appends, each
        request parses only what was appended since the last one, where the earlier
        window's last line is still where it was, and projects only new text.

        With ``context`` (a turn's start), a window that must be parsed anew is read from
        its end and parsed only from the lines after its latest compaction checkpoint's
        cutoff when ``checkpoint_tail`` finds them (``_context_bytes``). A long session's
        turn then reads what compaction kept, not the whole window (up to 2 MiB of
        history, several times that once parsed). What the cache keeps for a turn is that
        part too (``context_tail``, ``ParsedWindow.context_only``), and the next turn goes
        on from it: what a session's turns keep follows its conversation, which compaction
        bounds, not its history, which only grows. A replay parses the whole window again.
        """
        entry = self._cache.latest(session_id)
        if entry is not None and entry[1][0].context_only and with_projection:
            entry = None  # a turn's part of the window: a replay needs all of it
        data = appended = None
        try:
            with (
                self._history(session_id) as (lock_fd, history_fd),
                holding(lock_fd, fcntl.LOCK_SH, wait),
            ):
                info = os.fstat(history_fd)
                key = _cache_key(info)
                start = _window_start(info.st_size)
                if entry is None or entry[0] != key:
                    if entry is not None:
                        appended = _appended(history_fd, info, entry[0], entry[1][0])
                    if appended is None:
                        data, offset, whole = (
                            _context_bytes(history_fd, info.st_size, start)
                            if context
                            else (pread_all(history_fd, info.st_size - start, start), start, True)
                        )
                elif entry[1][1] is not None or not with_projection:
                    return entry[1]
        except OSError:
            raise unavailable() from None
        if data is not None:
            window = parse_window(data, offset, session_id)
            if not whole:  # only the lines after the checkpoint's cutoff were read
                window = replace(window, context_only=True)
        elif appended is not None:
            assert entry is not None
            extended = extend_window(entry[1][0], appended, start)
            if extended is None:  # only a whole parse can judge what was appended
                self._cache.forget(session_id)
                return self._window_and_projection(
                    session_id, wait, with_projection=with_projection, context=context
                )
            window = extended
        else:  # unchanged, and parsed for a turn: only the projection is new
            assert entry is not None
            window = entry[1][0]
        if context:
            window = context_tail(window) or window
        earlier = entry[1][1] if entry is not None else None
        projection = project(window.records, earlier) if with_projection else None
        self._cache.put(session_id, key, (window, projection))
        return window, projection

    def load_context(self, session_id: object) -> SessionContext:
        """The conversation state a new turn starts from (bounded to the replay window).

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE``; ``SESSION_BUSY``
                when the append lock stays held.
        """
        name = validate_session_id(session_id)
        window, _ = self._window_and_projection(
            name, WRITER_LOCK_WAIT, with_projection=False, context=True
        )
        kept = effective(window.records)
        compaction = window.compaction if len(kept) == len(window.records) else None
        if compaction is None:
            compaction = latest_compaction(kept)
        cutoff = compaction.cutoff_seq if compaction else -1
        first = bisect.bisect_right(kept, cutoff, key=attrgetter("seq"))  # ``kept`` is in seq order
        return SessionContext(
            summary=compaction.summary if compaction else None,
            cutoff_seq=compaction.cutoff_seq if compaction else None,
            records=ContextRecords(kept, first),
            history_cut=window_omits_history(window, compaction),
            gap=window.gap,
        )

    def replay(self, session_id: object, after: object, limit: object) -> dict[str, object]:
        """One ``session.replay`` success payload (read-only, no lease needed).

        A cursor that does not match the current projection (malformed, other session,
        stale) yields ``resync_required``, not an error.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``INVALID_PAYLOAD`` for a non-integer or
                non-positive ``limit`` or an ``after`` that is not a string of at most 128
                bytes; ``LIMIT_EXCEEDED`` for ``limit`` over 32;
                ``SESSION_UNAVAILABLE`` for a missing/unreadable session; ``SESSION_BUSY``
                while an append holds the append lock.
        """
        name, cursor, page_limit = _replay_arguments(session_id, after, limit)
        window, projection = self._window_and_projection(
            name, REPLAY_LOCK_WAIT, with_projection=True
        )
        assert projection is not None
        return _page(name, window, projection, cursor, page_limit)

    def history(self, session_id: str, after: str | None) -> History | None:
        """Every replay item after ``after`` with its turn (``session.watch``), or None
        when the cursor does not match the current projection. Blocking.

        Raises:
            ServiceError: as ``replay``.
        """
        name, cursor, _ = _replay_arguments(session_id, after, 1)
        window, projection = self._window_and_projection(
            name, REPLAY_LOCK_WAIT, with_projection=True
        )
        assert projection is not None
        gap = window.gap or window_omits_history(window, window.compaction)
        # A rewind took back what followed its point: its approvals too.
        return history_after(name, effective(window.records), projection, cursor, gap)

    def transcript(self, session_id: object) -> Transcript:
        """The replay window at once (``Transcript``), for a reader that shows a whole
        session rather than paging; waits up to 5 s for the append lock, as
        ``load_context`` does.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` for a missing or
                unreadable session; ``SESSION_BUSY`` when the append lock stays held.
        """
        name = validate_session_id(session_id)
        window, projection = self._window_and_projection(
            name, WRITER_LOCK_WAIT, with_projection=True
        )
        assert projection is not None
        kept = effective(window.records)
        compaction = latest_compaction(kept)
        cutoff = compaction.cutoff_seq if compaction else -1
        return Transcript(
            items=tuple(projection.items),
            records=tuple(r for r in kept if r.seq > cutoff),
            gap=window.gap or window_omits_history(window, compaction),
        )

    def remove(self, session_id: object) -> None:
        """Delete a session: its directory and every file in it.

        Only under the session's writer lease, taken without waiting: a session that a
        service has open (an attachment, a running turn, in any process) is refused, and
        no service can open it meanwhile. Nothing is touched unless the directory and
        every entry in it belong to this user and none is a directory. The directory is
        first renamed to a hidden ``.rm-<id>`` (no open by ID finds it from then on),
        then emptied and removed; a crash midway leaves only that hidden directory, which
        listing ignores.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` for a missing
                session (or one without a regular history); ``SESSION_BUSY`` while another
                holder has the lease.
            ForeignEntries: the directory or an entry in it is another user's, or an entry
                is a directory.
            OSError: the directory could not be renamed, emptied or removed.
        """
        name = validate_session_id(session_id)
        if not self.exists(name):
            raise unavailable()
        root_fd = os.open(self._root, ROOT_DIR_FLAGS)
        try:
            dir_fd = self._open_dir(name)
            try:
                _removable_entries(dir_fd)  # checked before the lease touches anything
            finally:
                os.close(dir_fd)
            with self.acquire_writer_lease(name):
                hidden = REMOVING_PREFIX + name
                os.rename(name, hidden, src_dir_fd=root_fd, dst_dir_fd=root_fd)
                self._cache.forget(name)
                _remove_directory(root_fd, hidden)
        finally:
            os.close(root_fd)

    def turn_outcome(self, session_id: object, turn_id: str) -> TurnOutcome | None:
        """What the whole durable history says about ``turn_id`` (``None``: no such turn).

        Streams the entire history in bounded chunks (not only the replay window); the
        append lock is held shared only while the readable length is taken.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` for a missing or
                unreadable session (as ``replay`` and ``load_context``); ``SESSION_BUSY``
                when the append lock stays held for 5 s.
        """
        name = validate_session_id(session_id)
        return self._scan(name, lambda user: user.turn_id == turn_id)

    def find_turn_by_key(self, session_id: object, key: str) -> TurnOutcome | None:
        """The outcome of the most recent turn whose user record carries ``key``.

        ``None`` when no turn does (always for a string that is not a valid key).

        Raises:
            ServiceError: as ``turn_outcome``.
        """
        name = validate_session_id(session_id)
        if not valid_idempotency_key(key):
            return self._scan(name, None)  # no scan, but a missing session still raises
        return self._scan(name, lambda user: user.idempotency_key == key)

    def close_interrupted_turn(
        self, session_id: object, turn_id: str, lease: WriterLease | None = None
    ) -> TurnOutcome | None:
        """Persist a ``failed`` terminal for a turn that has no terminal; its outcome after.

        For a turn with a user record and no terminal (its process died mid-turn), takes
        the writer lease without waiting (which also truncates a torn tail), appends
        ``{"type":"terminal","status":"failed","assistant_text":<persisted text>}`` with no
        ``sequence`` and releases the lease. With ``lease``, the session's lease the caller
        holds and appends nothing else under meanwhile, appends under that one instead. A
        turn that already has a terminal is returned as is and nothing is written; an
        unknown turn gives ``None``.

        Raises:
            ServiceError: as ``turn_outcome``; ``SESSION_BUSY`` when another holder (any
                process, or another lease in this one) has the writer lease;
                ``SESSION_UNAVAILABLE`` when the append fails.
        """
        name = validate_session_id(session_id)
        outcome = self.turn_outcome(name, turn_id)
        if outcome is None or outcome.status is not None:
            return outcome
        if lease is not None:
            return self._close_turn(lease, turn_id)
        with self.acquire_writer_lease(name) as own:
            return self._close_turn(own, turn_id)

    def close_last_interrupted_turn(self, lease: WriterLease) -> TurnOutcome | None:
        """``close_interrupted_turn`` for the latest turn of ``lease``'s session, when it
        has no terminal (``None`` otherwise): what a service does on taking the lease,
        since no turn can be running under it then.

        Reads the window's last :data:`LATEST_TURN_BYTES` (the whole window when the latest
        turn starts before them), decoding lines from the end back to the latest turn's
        start; the whole history only when no turn starts in the window.

        Raises:
            ServiceError: as ``close_interrupted_turn``.
        """
        name = lease.session_id
        for tail in (LATEST_TURN_BYTES, None):
            data, start = self._window_bytes(name, WRITER_LOCK_WAIT, tail)
            found = _latest_turn(records_backward(data, start))
            if found is not None or tail is None or len(data) < tail:
                break
        if found is not None:
            turn_id, ended = found
            return None if ended else self._close_turn(lease, turn_id)
        if start == 0:
            return None  # no turn at all
        latest = self._scan(name, lambda _: True)
        if latest is None or latest.status is not None:
            return None
        return self._close_turn(lease, latest.turn_id)

    def _close_turn(self, lease: WriterLease, turn_id: str) -> TurnOutcome | None:
        # What the lease submitted is in the file first; then nobody else can append, and
        # this read is authoritative.
        lease.wait_durable(lease.submitted_seq)
        outcome = self.turn_outcome(lease.session_id, turn_id)
        if outcome is None or outcome.status is not None:
            return outcome
        terminal: dict[str, object] = {
            "type": "terminal",
            "turn_id": turn_id,
            "status": "failed",
            "assistant_text": outcome.assistant_text,
        }
        try:
            lease.append(terminal)
        except ServiceError as exc:
            if exc.code is not ErrorCode.LIMIT_EXCEEDED:
                raise
            # Only a hand-made history holds that much text (a turn's text is bounded
            # far below a record); replay shows the assistant records either way.
            lease.append({**terminal, "assistant_text": ""})
            return replace(outcome, status="failed", assistant_text="")
        return replace(outcome, status="failed")

    def _scan(
        self, session_id: str, matches: Callable[[UserRecord], bool] | None
    ) -> TurnOutcome | None:
        """The latest turn whose user record ``matches`` (``None`` only opens the files)."""
        try:
            with self._history(session_id) as (lock_fd, history_fd):
                if matches is None:
                    return None
                with holding(lock_fd, fcntl.LOCK_SH, WRITER_LOCK_WAIT):
                    end = complete_prefix(history_fd, os.fstat(history_fd).st_size)
                # Whole lines before ``end`` never change: the scan needs no lock.
                return scan_turn(history_fd, end, MAX_APPEND_RECORD_BYTES, matches)
        except OSError:
            raise unavailable() from None

    @contextlib.contextmanager
    def _history(self, session_id: str) -> Iterator[tuple[int, int]]:
        """The session's append lock and history, opened for reading (closed after)."""
        fds = [self._open_dir(session_id)]
        try:
            fds.append(open_regular(APPEND_LOCK, os.O_RDONLY, dir_fd=fds[0]))
            fds.append(open_regular(HISTORY, os.O_RDONLY, dir_fd=fds[0]))
            yield fds[1], fds[2]
        finally:
            close_all(fds)

    def list_sessions(
        self, after: object, limit: object, *, page_past_budget: bool = False
    ) -> dict[str, object]:
        """One ``session.list`` success payload; see ``listing.list_sessions``."""
        return list_sessions(
            self._root, after, limit, self._index, page_past_budget=page_past_budget
        )

    def library(self, query: LibraryQuery) -> dict[str, object]:
        """One page of the session library; see ``listing.library_page``."""
        return library_page(self._root, query, self._index)

    def rename(self, session_id: object, title: str) -> dict[str, object]:
        """Give a session an explicit title (sanitized as every title; it wins over the
        one taken from the first prompt) and return its library entry.

        Raises:
            ValueError: nothing displayable remains of ``title``.
            ServiceError: as ``set_archived``.
        """
        clean = sanitize_title(title)
        if clean is None:
            raise ValueError("empty title")
        return self._change_meta(session_id, lambda m: {**m, "title": clean, "title_set": True})

    def set_archived(self, session_id: object, archived: bool) -> dict[str, object]:
        """Archive (hide from the default lists) or unarchive a session and return its
        library entry. Needs no writer lease: a session open elsewhere may be archived.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` for a missing
                session or unwritable metadata; ``SESSION_BUSY`` while its append lock
                stays held.
        """
        return self._change_meta(session_id, lambda m: {**m, "archived": archived})

    def grants(self, session_id: object) -> object:
        """The session's stored grants document (``meta.json``'s ``grants``; None when
        it has none, or there is no such session). Not checked here: the reader does.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` when the
                metadata cannot be read.
        """
        name = validate_session_id(session_id)
        if not self.exists(name):
            return None
        dir_fd = self._open_dir(name)
        try:
            meta, readable = read_meta(dir_fd)
        finally:
            os.close(dir_fd)
        if not readable:
            raise unavailable()
        return meta.get("grants")

    def change_grants(self, session_id: object, change: Callable[[object], object]) -> object:
        """Replace the session's grants document by ``change(stored)`` (under the append
        lock, as every metadata change) and return it.

        Raises:
            ServiceError: as ``set_archived``; whatever ``change`` raises.
        """
        name = validate_session_id(session_id)
        if not self.exists(name):
            raise unavailable()
        dir_fd = self._open_dir(name)
        try:
            meta = update_meta(
                self._root / name, dir_fd, lambda m: {**m, "grants": change(m.get("grants"))}
            )
        except OSError:
            raise unavailable() from None
        finally:
            os.close(dir_fd)
        return meta.get("grants")

    def _change_meta(
        self, session_id: object, change: Callable[[dict[str, object]], dict[str, object]]
    ) -> dict[str, object]:
        name = validate_session_id(session_id)
        if not self.exists(name):
            raise unavailable()
        dir_fd = self._open_dir(name)
        try:
            meta = update_meta(self._root / name, dir_fd, change)
            info = os.stat(HISTORY, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise unavailable() from None
        finally:
            os.close(dir_fd)
        return library_item(name, meta, info.st_mtime_ns)

    # -- the prompt queue (RFC-0002 §6.12; ``sessions.queue``) ------------------------------

    def queue(self, session_id: object) -> list[QueueEntry]:
        """The session's queued prompts, in order.

        Raises:
            ServiceError: ``INVALID_SESSION_ID``; ``SESSION_UNAVAILABLE`` for a missing
                session or an unreadable queue.
        """
        dir_fd = self._open_dir(session_id)
        try:
            return read_queue(dir_fd)
        except OSError:
            raise unavailable() from None
        finally:
            os.close(dir_fd)

    def change_queue(
        self,
        session_id: object,
        change: Callable[[list[QueueEntry]], list[QueueEntry] | None],
    ) -> list[QueueEntry]:
        """Apply ``change`` to the session's queue (``sessions.queue.update_queue``).

        Raises:
            ServiceError: as :meth:`queue`; ``SESSION_BUSY`` while its append lock stays
                held.
        """
        name = validate_session_id(session_id)
        if not self.exists(name):
            raise unavailable()
        dir_fd = self._open_dir(name)
        try:
            return update_queue(self._root / name, dir_fd, change)
        except OSError:
            raise unavailable() from None
        finally:
            os.close(dir_fd)

    # -- fork and rewind (RFC-0002 §6.16; ``rewind``) -------------------------------------

    def session_dir(self, session_id: str) -> Path:
        """The directory of a valid session ID (its checkpoints live there)."""
        return self._root / validate_session_id(session_id)

    def turn_boundary(self, session_id: object, cursor: object) -> tuple[int, int]:
        """Where a replay cursor at a turn boundary is in the history: ``(the seq of the
        record it follows, the index of the first item after it)`` — the header's seq
        (0) for the start cursor, else the terminal record of the item it names.

        Raises:
            ServiceError: as ``transcript``; ``INVALID_PAYLOAD`` for a cursor that is not
                a string of at most 128 bytes.
            StaleCursor: the cursor does not match the history.
            NotTurnBoundary: it names an item that does not end a turn.
        """
        name, after, _ = _replay_arguments(session_id, cursor, 1)
        if after is None:
            raise ServiceError(ErrorCode.INVALID_PAYLOAD)
        _, projection = self._window_and_projection(name, WRITER_LOCK_WAIT, with_projection=True)
        assert projection is not None
        index = resolve_cursor(name, projection, after)
        if index is None:
            raise StaleCursor
        if index == 0:
            return 0, 0
        item = projection.items[index - 1]
        if item.kind != "terminal":
            raise NotTurnBoundary
        return item.seq, index

    def whole_history(self, session_id: object) -> list[tuple[Record, bytes]]:
        """Every readable record of the whole history with its line, in ``seq`` order
        (torn or malformed lines skipped). Raises ServiceError as ``turn_outcome``."""
        name = validate_session_id(session_id)
        try:
            with self._history(name) as (lock_fd, history_fd):
                with holding(lock_fd, fcntl.LOCK_SH, WRITER_LOCK_WAIT):
                    end = complete_prefix(history_fd, os.fstat(history_fd).st_size)
                data = pread_all(history_fd, end, 0)
        except OSError:
            raise unavailable() from None
        out: list[tuple[Record, bytes]] = []
        for line in data.split(b"\n"):
            record = decode_line(line) if line else None
            if record is not None and (not out or record.seq > out[-1][0].seq):
                out.append((record, line))
        return out

    def fork(self, session_id: object, cursor: object) -> dict[str, object]:
        """A new session whose history is this one's up to ``cursor`` (a turn boundary):
        the records a rewind to it would leave (``effective``), copied line for line
        after a header of its own, with the checkpoints they name. The sidecars link
        both ways (``forked_from``, ``forks``). Returns the new session's library entry.

        Raises:
            ServiceError: as ``turn_boundary``; ``SESSION_UNAVAILABLE`` when the store
                cannot be written.
        """
        name = validate_session_id(session_id)
        cut, _ = self.turn_boundary(name, cursor)
        lines = self.whole_history(name)
        records = [record for record, _ in lines]
        end = records[-1].seq + 1 if records else 1
        kept = {r.seq for r in effective([*records, RewindRecord(end, cut)])}
        body = [line for record, line in lines if record.seq in kept and record.seq > 0]
        changes = [
            change
            for record, line in lines
            if record.seq in kept and isinstance(record, UnknownRecord)
            if (change := file_change_of(record, line)) is not None
        ]
        dir_fd = self._open_dir(name)
        try:
            meta = read_meta(dir_fd)[0]
        finally:
            os.close(dir_fd)
        sidecar: dict[str, object] = {
            key: meta[key] for key in ("title", "title_set") if key in meta
        }
        sidecar["forked_from"] = {"session_id": name, "at_cursor": cursor}
        project = meta.get("project_dir")
        try:
            for _ in range(8):
                fork_id = new_session_id()
                if not os.path.lexists(self._root / fork_id):
                    self._build(
                        fork_id,
                        Path(project) if isinstance(project, str) else None,
                        sidecar,
                        b"".join(line + b"\n" for line in body),
                    )
                    break
            else:
                raise unavailable()
        except OSError:
            raise unavailable() from None
        Checkpoints(self._root / name).link_into(
            self._root / fork_id, (change.before for change in changes)
        )

        def link(meta: dict[str, object]) -> dict[str, object]:
            forks = meta.get("forks")
            known = [f for f in forks if isinstance(f, str)] if isinstance(forks, list) else []
            return {**meta, "forks": [*known, fork_id][-MAX_FORK_LINKS:]}

        with contextlib.suppress(OSError, ServiceError):  # the fork names its origin anyway
            self._change_meta(name, link)
        info = os.stat(self._root / fork_id / HISTORY, follow_symlinks=False)
        return library_item(fork_id, {**sidecar, "project_dir": project}, info.st_mtime_ns)
