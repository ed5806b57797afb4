"""A session's ``queue.json`` sidecar: its prompt queue (RFC-0002 §6.12), never history.

``{"v": 1, "entries": [{"entry_id": "q_...", "text": "...", "by": "<label>",
"added_at": "<RFC 3339>"}, ...]}``, in the order the entries run. An entry leaves the file
when its turn was accepted (its user record is durable; the turn carries the entry's ID as
its idempotency key, so a start repeated after a crash between the two starts nothing).

Bounds are checked by the daemon before a change; a file over them (written by hand) is
read as far as they go. Changes are read-modify-write under the session's append lock, as
``meta.json`` (``sessions.meta``), and replace the file atomically.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

import orjson

from magi_code.dataclass import dataclass
from magi_code.sessions.fileio import APPEND_LOCK, holding, pread_all
from magi_code.sessions.meta import META_LOCK_WAIT
from magi_code.storage.files import atomic_write, open_regular

QUEUE: Final = "queue.json"
QUEUE_VERSION: Final = 1
# Bounds of one session's queue (RFC-0002 §6.12): entries, one entry's text (the v1
# string bound, as a prompt's) and all the entries' text together.
MAX_QUEUE_ENTRIES: Final = 32
MAX_QUEUE_TEXT_BYTES: Final = 16_384
MAX_QUEUE_TOTAL_BYTES: Final = 262_144
# Text plus IDs, labels and JSON escapes (at most 6 bytes a text byte).
QUEUE_MAX_FILE_BYTES: Final = 6 * MAX_QUEUE_TOTAL_BYTES + 64 * 1024


@dataclass(frozen=True, slots=True)
class QueueEntry:
    entry_id: str
    text: str
    by: str
    added_at: str

    def item(self) -> dict[str, str]:
        return {
            "entry_id": self.entry_id,
            "text": self.text,
            "by": self.by,
            "added_at": self.added_at,
        }


def _entry(value: object) -> QueueEntry | None:
    if not isinstance(value, dict):
        return None
    fields = [value.get(k) for k in ("entry_id", "text", "by", "added_at")]
    if not all(isinstance(f, str) for f in fields):
        return None
    entry_id, text, by, added_at = (str(f) for f in fields)
    return QueueEntry(entry_id, text, by, added_at)


def read_queue(dir_fd: int) -> list[QueueEntry]:
    """The queue's entries (none when the file is absent).

    Raises:
        OSError: the file cannot be read or is not a queue (never taken for an empty one).
    """
    try:
        fd = open_regular(QUEUE, os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        return []
    try:
        data = pread_all(fd, QUEUE_MAX_FILE_BYTES + 1, 0)
    finally:
        os.close(fd)
    if len(data) > QUEUE_MAX_FILE_BYTES:
        raise OSError("queue file too large")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise OSError("unreadable queue file") from None
    raw = doc.get("entries") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise OSError("unreadable queue file")
    entries = [e for e in map(_entry, raw) if e is not None]
    return entries[:MAX_QUEUE_ENTRIES]


def update_queue(
    session_dir: Path,
    dir_fd: int,
    change: Callable[[list[QueueEntry]], list[QueueEntry] | None],
) -> list[QueueEntry]:
    """Apply ``change`` to the entries under the append lock and return those now stored
    (``change`` returns ``None`` to leave them as they are).

    Raises:
        OSError: the lock or the file could not be read or written.
        ServiceError: ``SESSION_BUSY`` when the append lock stays held.
    """
    lock_fd = open_regular(APPEND_LOCK, os.O_RDWR, dir_fd=dir_fd)
    try:
        with holding(lock_fd, fcntl.LOCK_EX, META_LOCK_WAIT):
            entries = read_queue(dir_fd)
            changed = change(list(entries))
            if changed is None:
                return entries
            doc = {"v": QUEUE_VERSION, "entries": [e.item() for e in changed]}
            atomic_write(session_dir / QUEUE, orjson.dumps(doc))
            return changed
    finally:
        os.close(lock_fd)
