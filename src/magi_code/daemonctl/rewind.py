"""``magi-code sessions fork|rewind ID AT``: RFC-0002 §6.16 from a terminal, through the
session store itself (as the other ``sessions`` actions), whether or not a daemon runs.

``AT`` is where to go back to: ``turn:N`` (after the N-th turn replay shows; ``turn:0``
is the start) or a ``session.replay`` cursor at a turn's end.

- ``fork ID AT``: a new session with the history up to ``AT``; prints its ID.
- ``rewind ID AT``: the preview — the messages that would leave the conversation and the
  files the agent changed after ``AT``, each with what a rewind would do to it now.
  With ``--yes``, the rewind itself, under the session's writer lease (refused, like
  ``rm``, while a running magi-code has the session open); ``--no-files`` leaves the
  files as they are, ``--force`` also overwrites files changed outside the agent since.

Exit status: 0; 1 when the session, the point or the lease was refused.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from magi_code.protocol.errors import ServiceError
from magi_code.protocol.limits import MAX_SESSION_PAGE_ITEMS
from magi_code.protocol.text import one_line
from magi_code.sessions.ids import validate_session_id
from magi_code.sessions.projection import start_cursor
from magi_code.sessions.rewind import commit_rewind, plan_rewind, rewind_answer
from magi_code.sessions.store import NotTurnBoundary, SessionStore, StaleCursor
from magi_code.storage.launch import LaunchContext

from .sessions import EXIT_FAILURE, fail, reason_for, shown_id

BAD_POINT: Final = "not a point of this session: use turn:N or a replay cursor at a turn's end"
INSIDE_TURN: Final = "that cursor is inside a turn: use one at a turn's end (turn:N)"
STATES: Final = {
    "restore": "restore",
    "restored": "restored",
    "unchanged": "unchanged",
    "conflict": "conflict (changed outside the agent since; kept unless --force)",
    "not_restorable": "not restorable (its checkpoint is gone)",
    "failed": "failed (it could not be written)",
    "kept": "kept (--no-files)",
}
EXCERPT: Final = 72


def main(
    ctx: LaunchContext,
    action: str,
    session_id: str,
    at: str,
    *,
    yes: bool = False,
    files: bool = True,
    force: bool = False,
) -> int:
    store = SessionStore(ctx.sessions_dir)
    try:
        cursor = _cursor(store, session_id, at)
        if cursor is None:
            return fail(f"{shown_id(at)}: {BAD_POINT}")
        if action == "fork":
            item = store.fork(session_id, cursor)
            sys.stdout.write(f"Forked {session_id} as {item['session_id']}\n")
            return 0
        if yes:
            with store.acquire_writer_lease(session_id) as lease:
                plan, results = commit_rewind(store, lease, cursor, files, force)
            answer = rewind_answer(plan, results, files)
        else:
            answer = rewind_answer(plan_rewind(store, session_id, cursor), None, files)
    except ServiceError as exc:
        return fail(f"{shown_id(session_id)}: {reason_for(exc)}")
    except StaleCursor:
        return fail(f"{shown_id(at)}: {BAD_POINT}")
    except NotTurnBoundary:
        return fail(f"{shown_id(at)}: {INSIDE_TURN}")
    _print(answer, yes)
    return 0 if all(state != "failed" for state in answer["file_states"]) else EXIT_FAILURE


def _cursor(store: SessionStore, session_id: str, at: str) -> str | None:
    """The replay cursor ``at`` names: ``turn:N`` found in the replay, else ``at``."""
    if not at.startswith("turn:"):
        return at
    number = at.removeprefix("turn:")
    if not number.isdigit():
        return None
    wanted, seen = int(number), 0
    if wanted == 0:
        return start_cursor(validate_session_id(session_id))
    page = store.replay(session_id, None, MAX_SESSION_PAGE_ITEMS)
    while True:
        events: list[dict[str, Any]] = page["events"]  # type: ignore[assignment]
        for item in events:
            if item["kind"] == "terminal":
                seen += 1
                if seen == wanted:
                    return str(item["cursor"])
        if not page["truncated"]:
            return None
        page = store.replay(session_id, page["next_cursor"], MAX_SESSION_PAGE_ITEMS)


def _print(answer: dict[str, Any], committed: bool) -> None:
    out = sys.stdout.write
    count = answer["message_count"]
    verb = "Removed" if committed else "Would remove"
    out(f"{verb} {count} item(s) from the conversation:\n")
    for message in answer["messages"]:
        if message["kind"] == "terminal":
            out(f"  [turn {message['status']}]\n")
            continue
        role = message.get("role", message["kind"])
        text = one_line(str(message.get("text", "")))
        out(f"  {role}: {text[:EXCERPT]}{'…' if len(text) > EXCERPT else ''}\n")
    if answer["file_count"]:
        out(f"Files the agent changed after that point ({answer['file_count']}):\n")
        for file in answer["files"]:
            out(f"  {STATES.get(file['state'], file['state'])}  {one_line(file['path'])}\n")
    else:
        out("No files the agent changed after that point.\n")
    if not committed:
        out("Nothing was changed. Run again with --yes to rewind.\n")
