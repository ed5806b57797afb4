"""``session.list`` and the session library: bounded directory scan, ordered pages,
sanitized titles.

``session.list`` pages by session ID and leaves archived sessions out (``meta``); the
library (``library_page``, RFC-0002 §6.11) orders every examined session by last activity
and filters by recorded project, title and archived state.

Every scan examines at most ``MAX_SESSION_LIST_SCAN_ENTRIES`` directory entries
(session or not), in directory order. A larger directory is ``limit_exceeded`` for a v1
client: its contract forbids an arbitrary partial page. A persistent (v2) client may ask
for ``page_past_budget``: the pages are then built from the sessions among the examined
entries and say ``incomplete``; paging by ``next_after`` still moves strictly forward
(and, while the directory is unchanged, sees the same entries each time), it just cannot
promise to reach sessions it never examined. Only the returned page's candidates are
opened, each with bounded reads and never blocking on a FIFO or other special file
planted in a session (``open_regular``).

The index
---------
Which names are candidates, and in what order, depends only on the entries of the
sessions directory itself. ``SessionIndex`` keeps the sorted candidates of the last
scan, keyed by the directory's ``fstat`` (device, inode, size, link count, mtime and
ctime, in nanoseconds): adding, removing or renaming an entry, by any process, changes
the directory's mtime and ctime, so a request whose ``fstat`` differs scans again. A page
is then a bisection plus its own candidates' reads: O(page), not O(sessions). Everything
shown about a session (is its history a regular file, ``updated_at``, the title) is
read from the session's own files on every request; the index only says which names to
look at.

Timestamps have a granularity (a kernel clock tick, or whole seconds on some
filesystems): two changes in one tick leave the same mtime, so a scan between them
would describe a directory that no longer exists under an unchanged key. A scan is
therefore reused only when the directory's timestamps were older than the scan by more
than ``RACY_NS`` (``COARSE_RACY_NS`` when they have no sub-second part); otherwise it
serves its own request and the next request scans again. The directory's ``fstat`` is
also taken after the scan: a change during the scan is never cached.
"""

from __future__ import annotations

import bisect
import os
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_SESSION_LIST_SCAN_ENTRIES, MAX_SESSION_PAGE_ITEMS
from magi_code.sessions.fileio import DIR_FLAGS, HISTORY, unavailable
from magi_code.sessions.ids import is_session_id, validate_session_id
from magi_code.sessions.meta import read_meta
from magi_code.sessions.records import rfc3339_utc
from magi_code.sessions.titles import sanitize_title

# How much older than a scan the directory's timestamps must be for it to be reused.
RACY_NS: Final = 100_000_000
COARSE_RACY_NS: Final = 2_100_000_000
_ROOT_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC

_Key = tuple[int, int, int, int, int, int]


def _key(info: os.stat_result) -> _Key:
    return (
        info.st_dev,
        info.st_ino,
        info.st_size,
        info.st_nlink,
        info.st_mtime_ns,
        info.st_ctime_ns,
    )


def _settled(info: os.stat_result, scan_started_ns: int) -> bool:
    """Whether any later change of the directory must give it other timestamps."""
    times = (info.st_mtime_ns, info.st_ctime_ns)
    coarse = all(t % 1_000_000_000 == 0 for t in times)
    return max(times) < scan_started_ns - (COARSE_RACY_NS if coarse else RACY_NS)


class SessionIndex:
    """The sorted candidates of the last scan of one sessions directory and its key.

    Shared by every request of the process (the daemon's clients included); callers run
    in worker threads, hence the lock. A scan in progress makes concurrent requests wait
    for it and use its result instead of scanning too.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: _Key | None = None
        self._names: tuple[str, ...] = ()
        self._incomplete = False
        self.scans = 0  # how many times the directory was read (tests and benchmarks)

    def candidates(self, root_fd: int) -> tuple[tuple[str, ...], bool]:
        """The sorted candidate names of the directory ``root_fd`` and whether its scan
        left entries unexamined (``OSError`` when it cannot be read)."""
        with self._lock:
            started = time.time_ns()
            before = os.fstat(root_fd)
            key = _key(before)
            if key == self._key:
                return self._names, self._incomplete
            self.scans += 1
            found, incomplete = _scan(root_fd)
            names = tuple(sorted(found))
            reusable = _key(os.fstat(root_fd)) == key and _settled(before, started)
            self._key = key if reusable else None
            self._names, self._incomplete = names, incomplete
            return names, incomplete


def check_page_limit(limit: object) -> int:
    """A list/replay page size: 1 to 32.

    Raises:
        ServiceError: ``INVALID_PAYLOAD`` for a non-integer or non-positive value;
            ``LIMIT_EXCEEDED`` above 32 (the spec lists the page limit among its bounds).
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    if limit > MAX_SESSION_PAGE_ITEMS:
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    return limit


def list_sessions(
    root: Path,
    after: object,
    limit: object,
    index: SessionIndex | None = None,
    *,
    page_past_budget: bool = False,
) -> dict[str, object]:
    """One ``session.list`` success payload, ordered by session ID.

    ``next_after`` is the last examined ID of a truncated page (it may be a candidate
    that could not be read, which then sets ``incomplete``). When the directory has more
    entries than one scan may examine, the request fails, or with ``page_past_budget``
    the pages come from the examined entries only and say ``incomplete``. ``index`` (see
    ``SessionIndex``) saves rescanning an unchanged directory; without one every request
    scans.

    Raises:
        ServiceError: ``INVALID_SESSION_ID`` for a bad ``after``; ``INVALID_PAYLOAD`` or
            ``LIMIT_EXCEEDED`` for a bad ``limit`` (see ``check_page_limit``);
            ``LIMIT_EXCEEDED`` past the scan budget without ``page_past_budget``;
            ``SESSION_UNAVAILABLE`` when the directory cannot be read.
    """
    floor = None if after is None else validate_session_id(after)
    page_limit = check_page_limit(limit)
    try:
        root_fd = os.open(root, _ROOT_FLAGS)
    except FileNotFoundError:
        return {"sessions": [], "next_after": None, "truncated": False, "incomplete": False}
    except OSError:
        raise unavailable() from None
    try:
        try:
            names, incomplete = (index or SessionIndex()).candidates(root_fd)
        except OSError:
            raise unavailable() from None
        if incomplete and not page_past_budget:
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
        start = 0 if floor is None else bisect.bisect_right(names, floor)
        page = names[start : start + page_limit + 1]
        truncated = len(page) > page_limit
        page = page[:page_limit]
        sessions: list[dict[str, object]] = []
        for name in page:
            summary, complete = _summarize(root_fd, name)
            incomplete |= not complete
            if summary is not None:
                sessions.append(summary)
    finally:
        os.close(root_fd)
    return {
        "sessions": sessions,
        "next_after": page[-1] if truncated else None,
        "truncated": truncated,
        "incomplete": incomplete,
    }


def _scan(root_fd: int) -> tuple[list[str], bool]:
    """Session-shaped directory names among the first examined entries, and whether
    entries were left unexamined (the scan budget ran out).

    Every entry counts, ``.new-*`` staging directories (whose names are not valid IDs)
    and stray files included: the budget bounds the directory read itself. Names are
    checked before any ``stat``. Raises ``OSError`` when the directory cannot be read.
    """
    names: list[str] = []
    with os.scandir(root_fd) as entries:
        for examined, entry in enumerate(entries, start=1):
            if examined > MAX_SESSION_LIST_SCAN_ENTRIES:
                return names, True
            name = entry.name
            if is_session_id(name) and entry.is_dir(follow_symlinks=False):
                names.append(name)
    return names, False


def _summarize(root_fd: int, name: str) -> tuple[dict[str, object] | None, bool]:
    """A list entry for ``name`` (or ``None``) and whether everything was readable."""
    try:
        dir_fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return None, False
    try:
        info = os.stat(HISTORY, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            return None, False
        updated = rfc3339_utc(datetime.fromtimestamp(info.st_mtime, UTC))
        meta, complete = read_meta(dir_fd)
    except (OSError, ValueError, OverflowError):
        return None, False
    finally:
        os.close(dir_fd)
    if meta.get("archived") is True:
        return None, complete  # hidden, not unreadable
    return {
        "session_id": name,
        "title": sanitize_title(meta.get("title")),
        "updated_at": updated,
    }, complete


# -- the session library (RFC-0002 §6.11): every examined session, by last activity -----

ARCHIVED_FILTERS: Final = (False, True, "all")


@dataclass(frozen=True, slots=True)
class LibraryQuery:
    """A library page's filters: ``project_dir`` (compared with the recorded directory,
    both with symlinks resolved), ``title`` (a case-insensitive substring of the title),
    ``archived`` (``False``: not archived, ``True``: archived only, ``"all"``), the
    previous page's ``cursor`` and the page ``limit``."""

    project_dir: str | None = None
    title: str | None = None
    archived: bool | str = False
    cursor: str | None = None
    limit: int = MAX_SESSION_PAGE_ITEMS


class BadCursor(Exception):
    """A library cursor this store did not issue."""


def library_item(session_id: str, meta: dict[str, object], mtime_ns: int) -> dict[str, object]:
    """One library entry: the v1 list fields plus ``project_dir`` and ``archived``, and
    the fork links of a session that has them (``forked_from``, ``forks``; §6.16)."""
    project = meta.get("project_dir")
    item: dict[str, object] = {
        "session_id": session_id,
        "title": sanitize_title(meta.get("title")),
        "updated_at": rfc3339_utc(datetime.fromtimestamp(mtime_ns / 1e9, UTC)),
        "project_dir": project if isinstance(project, str) else None,
        "archived": meta.get("archived") is True,
    }
    origin, forks = meta.get("forked_from"), meta.get("forks")
    if isinstance(origin, dict) and all(
        isinstance(origin.get(key), str) for key in ("session_id", "at_cursor")
    ):
        item["forked_from"] = {key: origin[key] for key in ("session_id", "at_cursor")}
    if isinstance(forks, list) and forks and all(isinstance(f, str) for f in forks):
        item["forks"] = list(forks)
    return item


def _parse_cursor(cursor: str) -> tuple[int, str]:
    mtime, _, name = cursor.partition(":")
    if not mtime.isdigit() or not is_session_id(name):
        raise BadCursor
    return int(mtime), name


def _matches(item: dict[str, object], query: LibraryQuery, project: str | None) -> bool:
    if query.archived != "all" and item["archived"] is not query.archived:
        return False
    if project is not None and item["project_dir"] != project:
        return False
    if query.title is not None:
        title = item["title"]
        return isinstance(title, str) and query.title.casefold() in title.casefold()
    return True


def library_page(
    root: Path, query: LibraryQuery, index: SessionIndex | None = None
) -> dict[str, object]:
    """One library page: matching sessions, most recent activity (history mtime) first,
    ties by ID; ``next_cursor`` continues after the page's last entry (``None`` on the
    last page). Every candidate is examined (its history's ``stat`` and its sidecar),
    up to the scan budget: past it the page says ``incomplete``, as does an unreadable
    candidate. A session whose activity changes between pages moves in the order (it may
    show up again, or not at all, on later pages): restart without a cursor to refresh.

    Raises:
        BadCursor: a cursor this function did not issue.
        ServiceError: ``SESSION_UNAVAILABLE`` when the directory cannot be read.
    """
    floor = None if query.cursor is None else _parse_cursor(query.cursor)
    project = None if query.project_dir is None else os.path.realpath(query.project_dir)
    try:
        root_fd = os.open(root, _ROOT_FLAGS)
    except FileNotFoundError:
        return {"sessions": [], "next_cursor": None, "incomplete": False}
    except OSError:
        raise unavailable() from None
    found: list[tuple[int, str, dict[str, object]]] = []
    try:
        try:
            names, incomplete = (index or SessionIndex()).candidates(root_fd)
        except OSError:
            raise unavailable() from None
        for name in names:
            entry, complete = _library_entry(root_fd, name)
            incomplete |= not complete
            if entry is not None and _matches(entry[1], query, project):
                found.append((entry[0], name, entry[1]))
    finally:
        os.close(root_fd)
    found.sort(key=lambda e: (-e[0], e[1]))
    if floor is not None:
        found = [e for e in found if (-e[0], e[1]) > (-floor[0], floor[1])]
    page = found[: query.limit]
    more = len(found) > query.limit
    return {
        "sessions": [e[2] for e in page],
        "next_cursor": f"{page[-1][0]}:{page[-1][1]}" if more else None,
        "incomplete": incomplete,
    }


def _library_entry(root_fd: int, name: str) -> tuple[tuple[int, dict[str, object]] | None, bool]:
    try:
        dir_fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return None, False
    try:
        info = os.stat(HISTORY, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            return None, False
        meta, complete = read_meta(dir_fd)
        item = library_item(name, meta, info.st_mtime_ns)
    except (OSError, ValueError, OverflowError):
        return None, False
    finally:
        os.close(dir_fd)
    return (info.st_mtime_ns, item), complete
