"""A session's ``meta.json`` sidecar: display and library metadata and the session's
approval grants, never history.

``{"v": 1, "title": "...", "title_set": true, "project_dir": "/abs", "archived": true,
"grants": {"commands": [["git", "status"]], "tools": [], "paths": []}}``, every key but
``v`` optional:

- ``title``: the display title. The first user prompt's (``titles.title_from_prompt``) is
  written only while there is none; a ``rename`` writes its own and sets ``title_set``,
  so an explicit title wins whenever it was written.
- ``project_dir``: the launch project directory of the client that created the session
  (symlinks resolved), written with the session itself. Sessions created before it was
  recorded have none and match no project filter.
- ``archived``: hidden from the default lists; the session is otherwise untouched.
- ``grants``: the session's "allow for this session" answers (RFC-0002 §6.7), as the
  settings' allow rules are written; bounded by ``core.approvals`` (at most
  ``MAX_GRANTS_BYTES`` encoded), so the sidecar stays within ``META_MAX_BYTES``.

Changes are read-modify-write under the session's append lock, held exclusively (the
writer lease is not needed: metadata is not history, and a frontend holding the session
open must not stop another from renaming or archiving it). The file is replaced
atomically; readers read it without a lock, bounded and never blocking on a special file.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from magi_code.sessions.fileio import APPEND_LOCK, META, holding, pread_all
from magi_code.storage.files import atomic_write, open_regular

# A title (at most 80 characters), a project path (at most 4,096 bytes) and the grants
# (at most MAX_GRANTS_BYTES), with room for JSON escapes.
META_MAX_BYTES: Final = 32 * 1024
MAX_GRANTS_BYTES: Final = 16 * 1024
META_VERSION: Final = 1
# How long a change waits for an append batch to finish.
META_LOCK_WAIT: Final = 5.0


def read_meta(dir_fd: int) -> tuple[dict[str, Any], bool]:
    """The sidecar's map (empty when absent or unreadable) and whether it was readable
    (an absent sidecar is readable: there is simply no metadata)."""
    try:
        fd = open_regular(META, os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        return {}, True
    except OSError:
        return {}, False  # a symlink or special file, refused without blocking
    try:
        data = pread_all(fd, META_MAX_BYTES + 1, 0)
    except OSError:
        return {}, False
    finally:
        os.close(fd)
    if len(data) > META_MAX_BYTES:
        return {}, False
    try:
        meta = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}, False
    if not isinstance(meta, dict):
        return {}, False
    return meta, True


def encode_meta(meta: dict[str, Any]) -> bytes:
    return orjson.dumps({**meta, "v": META_VERSION})


def update_meta(
    session_dir: Path, dir_fd: int, change: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> dict[str, Any]:
    """Apply ``change`` to the sidecar under the append lock and return the map now
    stored (``change`` returns ``None`` to leave it as it is).

    Raises:
        OSError: the lock or the sidecar could not be read or written (an unreadable
            sidecar is never taken for an empty one).
        ServiceError: ``SESSION_BUSY`` when the append lock stays held.
    """
    lock_fd = open_regular(APPEND_LOCK, os.O_RDWR, dir_fd=dir_fd)
    try:
        with holding(lock_fd, fcntl.LOCK_EX, META_LOCK_WAIT):
            meta, readable = read_meta(dir_fd)
            if not readable:
                raise OSError("unreadable session metadata")
            changed = change(dict(meta))
            if changed is None:
                return meta
            atomic_write(session_dir / META, encode_meta(changed))
            return changed
    finally:
        os.close(lock_fd)
