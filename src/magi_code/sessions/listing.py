"""``session.list``: bounded directory scan, ordered pages, sanitized titles.

Every request examines at most ``MAX_SESSION_LIST_SCAN_ENTRIES`` directory entries
(session or not), in directory order. In a larger directory the page is built from the
sessions among the examined entries and says ``incomplete``: paging by ``next_after``
still moves strictly forward (and, while the directory is unchanged, sees the same
entries each time), it just cannot promise to reach sessions it never examined. Only the
returned page's candidates are opened, each with bounded reads and never blocking on a
FIFO or other special file planted in a session (``open_regular``).
"""

from __future__ import annotations

import heapq
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import orjson

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_SESSION_LIST_SCAN_ENTRIES, MAX_SESSION_PAGE_ITEMS
from magi_code.sessions.fileio import DIR_FLAGS, HISTORY, META, pread_all, unavailable
from magi_code.sessions.ids import validate_session_id
from magi_code.sessions.records import rfc3339_utc
from magi_code.sessions.titles import sanitize_title
from magi_code.storage.files import open_regular

META_MAX_BYTES: Final = 4096


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


def list_sessions(root: Path, after: object, limit: object) -> dict[str, object]:
    """One ``session.list`` success payload, ordered by session ID.

    ``next_after`` is the last examined ID of a truncated page (it may be a candidate
    that could not be read, which then sets ``incomplete``). ``incomplete`` is also set
    when the directory has more entries than one request may examine: the page then
    comes from the examined ones only.

    Raises:
        ServiceError: ``INVALID_SESSION_ID`` for a bad ``after``; ``INVALID_PAYLOAD`` or
            ``LIMIT_EXCEEDED`` for a bad ``limit`` (see ``check_page_limit``);
            ``SESSION_UNAVAILABLE`` when the directory cannot be read.
    """
    floor = None if after is None else validate_session_id(after)
    page_limit = check_page_limit(limit)
    candidates, incomplete = _scan(root, floor)
    page = heapq.nsmallest(page_limit + 1, candidates)
    truncated = len(page) > page_limit
    page = page[:page_limit]
    sessions: list[dict[str, object]] = []
    for name in page:
        summary, complete = _summarize(root, name)
        incomplete |= not complete
        if summary is not None:
            sessions.append(summary)
    return {
        "sessions": sessions,
        "next_after": page[-1] if truncated else None,
        "truncated": truncated,
        "incomplete": incomplete,
    }


def _scan(root: Path, floor: str | None) -> tuple[list[str], bool]:
    """Session-shaped directory names above ``floor`` among the first examined entries,
    and whether entries were left unexamined (the scan budget ran out).

    Every entry counts, ``.new-*`` staging directories (whose names are not valid IDs)
    and stray files included: the budget bounds the directory read itself. Names are
    checked before any ``stat``.
    """
    names: list[str] = []
    try:
        with os.scandir(root) as entries:
            for examined, entry in enumerate(entries, start=1):
                if examined > MAX_SESSION_LIST_SCAN_ENTRIES:
                    return names, True
                name = entry.name
                wanted = (floor is None or name > floor) and _is_session_name(name)
                if wanted and entry.is_dir(follow_symlinks=False):
                    names.append(name)
    except FileNotFoundError:
        return [], False
    except OSError:
        raise unavailable() from None
    return names, False


def _is_session_name(name: str) -> bool:
    try:
        validate_session_id(name)
    except ServiceError:
        return False
    return True


def _summarize(root: Path, name: str) -> tuple[dict[str, object] | None, bool]:
    """A list entry for ``name`` (or ``None``) and whether everything was readable."""
    try:
        dir_fd = os.open(root / name, DIR_FLAGS)
    except OSError:
        return None, False
    try:
        info = os.stat(HISTORY, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            return None, False
        updated = rfc3339_utc(datetime.fromtimestamp(info.st_mtime, UTC))
        title, complete = _read_title(dir_fd)
    except (OSError, ValueError, OverflowError):
        return None, False
    finally:
        os.close(dir_fd)
    return {"session_id": name, "title": title, "updated_at": updated}, complete


def _read_title(dir_fd: int) -> tuple[str | None, bool]:
    """The sanitized sidecar title (bounded read) and whether the sidecar was readable."""
    try:
        fd = open_regular(META, os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, True
    except OSError:
        return None, False  # a symlink or special file, refused without blocking
    try:
        data = pread_all(fd, META_MAX_BYTES + 1, 0)
    except OSError:
        return None, False
    finally:
        os.close(fd)
    if len(data) > META_MAX_BYTES:
        return None, False
    try:
        meta = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None, False
    if not isinstance(meta, dict):
        return None, False
    return sanitize_title(meta.get("title")), True
