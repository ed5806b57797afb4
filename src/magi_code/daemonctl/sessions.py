"""``magi-code sessions list|show|rm|rename|archive|unarchive``: the sessions of this
``MC_HOME`` from a terminal.

Read and removed through the session store itself (``sessions.store``), the same files,
locks and leases every service uses, so these work alike whether or not a daemon runs:

- ``list``: every session not archived, least recent activity first (the most recent
  last, nearest the prompt), with its last activity and title, paged through the session
  library (``SessionStore.library``, as RFC-0002's ``sessions_list``); ``--project``,
  ``--title`` and ``--archived`` filter as its filters do.
- ``show ID``: the conversation as ``session.replay`` projects it (the summary of a
  compacted past, user and assistant messages, how each turn that did not complete
  ended), with the agent's tool calls between the messages. Like replay it reads the
  recent window of the history (2 MiB), and says so when earlier history is left out.
- ``rm ID…``: deletes each session under its writer lease (``SessionStore.remove``). A
  session that a service has open is refused: a frontend's attachment, a turn running
  (a daemon's detached turns included), ``--prompt`` meanwhile. Nothing that is not
  this user's is touched. It then finishes what a crash left unfinished
  (``remove_leftovers``), which no ID names.
- ``rename ID TITLE``, ``archive ID…``, ``unarchive ID…``: change the session's metadata
  (``SessionStore.rename``/``set_archived``). Metadata is not history: no writer lease is
  taken, so a session a frontend has open can be renamed or archived (it keeps running).

Output is for the person at the terminal: text from the history has its control
characters removed, so it cannot drive the terminal. Exit status: 0; 1 when a session
could not be shown or any could not be removed (one ``magi-code: …`` line each).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Final

import orjson

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_SESSION_PAGE_ITEMS
from magi_code.protocol.text import one_line, without_hidden
from magi_code.sessions.listing import LibraryQuery
from magi_code.sessions.records import ToolCallRecord
from magi_code.sessions.store import ForeignEntries, SessionStore, Transcript, remove_leftovers
from magi_code.storage.launch import LaunchContext

EXIT_FAILURE: Final = 1
# The most of a tool call's arguments a transcript line shows.
MAX_ARGUMENT_CHARS: Final = 200
# Why a session was not shown or removed, by the store's error.
REASONS: Final = {
    ErrorCode.INVALID_SESSION_ID: "not a session ID",
    ErrorCode.SESSION_UNAVAILABLE: "no such session in this MC_HOME",
    ErrorCode.SESSION_BUSY: (
        "in use: a running magi-code has it open (a frontend, a turn the daemon runs, "
        "or --prompt); close it there or let its turn end, then try again"
    ),
}
NOT_YOURS: Final = "it holds files that are not yours (or a directory); nothing was removed"
HISTORY_CUT: Final = (
    "(part of this session is not shown: it lies before the recent window that is read, "
    "or a line of its history is damaged)"
)


def fail(message: str) -> int:
    sys.stderr.write(f"magi-code: {message}\n")
    return EXIT_FAILURE


def reason_for(exc: ServiceError) -> str:
    return REASONS.get(exc.code, exc.code.value)


def main(
    ctx: LaunchContext,
    action: str,
    session_ids: Sequence[str],
    *,
    as_json: bool = False,
    project: str | None = None,
    title: str | None = None,
    archived: bool = False,
) -> int:
    """Run one action; ``title`` is the filter of ``list`` and the new title of
    ``rename``, ``project`` a directory relative to the current one or absolute."""
    store = SessionStore(ctx.sessions_dir)
    if action == "list":
        directory = None if project is None else os.path.abspath(project)
        query = LibraryQuery(directory, title, archived)
        return list_sessions(store, query, as_json=as_json)
    if action == "show":
        return show(store, session_ids[0])
    if action == "rename":
        assert title is not None
        return change(store, session_ids, lambda sid: store.rename(sid, title), "Renamed")
    if action in ("archive", "unarchive"):
        archived = action == "archive"
        done = "Archived" if archived else "Unarchived"
        return change(store, session_ids, lambda sid: store.set_archived(sid, archived), done)
    code = remove(store, session_ids)
    remove_leftovers(ctx.sessions_dir)  # and what a crash left of an earlier removal
    return code


def _all_sessions(store: SessionStore, query: LibraryQuery) -> tuple[list[dict[str, Any]], bool]:
    sessions: list[dict[str, Any]] = []
    incomplete = False
    cursor = None
    while True:
        page: dict[str, Any] = store.library(
            replace(query, cursor=cursor, limit=MAX_SESSION_PAGE_ITEMS)
        )
        sessions += page["sessions"]
        incomplete |= page["incomplete"]
        cursor = page["next_cursor"]
        if cursor is None:
            return sessions, incomplete


def list_sessions(store: SessionStore, query: LibraryQuery, *, as_json: bool) -> int:
    try:
        sessions, incomplete = _all_sessions(store, query)
    except ServiceError:
        return fail("the sessions directory of this MC_HOME cannot be read")
    sessions.reverse()  # the most recent last
    if as_json:
        document = {"sessions": sessions, "incomplete": incomplete}
        sys.stdout.write(orjson.dumps(document).decode() + "\n")
        return 0
    for entry in sessions:
        title = entry["title"] or "(no title)"
        sys.stdout.write(f"{entry['session_id']}  {entry['updated_at']}  {title}\n")
    if not sessions:
        filtered = query != LibraryQuery()
        sys.stdout.write(
            "No matching sessions.\n" if filtered else "No sessions in this MC_HOME.\n"
        )
    if incomplete:
        sys.stderr.write("magi-code: some sessions could not be read and are not listed\n")
    return 0


def show(store: SessionStore, session_id: str) -> int:
    try:
        transcript = store.transcript(session_id)
    except ServiceError as exc:
        return fail(f"{shown_id(session_id)}: {reason_for(exc)}")
    for line in transcript_lines(transcript):
        sys.stdout.write(line + "\n")
    return 0


def remove(store: SessionStore, session_ids: Sequence[str]) -> int:
    code = 0
    for session_id in session_ids:
        try:
            store.remove(session_id)
        except ServiceError as exc:
            code = fail(f"{shown_id(session_id)}: {reason_for(exc)}")
        except ForeignEntries:
            code = fail(f"{session_id}: {NOT_YOURS}")
        except OSError as exc:
            code = fail(f"{session_id}: it could not be removed ({exc.strerror})")
        else:
            sys.stdout.write(f"Removed {session_id}\n")
    return code


def change(
    store: SessionStore,
    session_ids: Sequence[str],
    apply: Callable[[str], dict[str, object]],
    done: str,
) -> int:
    code = 0
    for session_id in session_ids:
        try:
            apply(session_id)
        except ServiceError as exc:
            code = fail(f"{shown_id(session_id)}: {reason_for(exc)}")
        except ValueError:
            code = fail(f"{session_id}: the title has nothing to show")
        else:
            sys.stdout.write(f"{done} {session_id}\n")
    return code


def shown_id(session_id: str) -> str:
    """An ID as typed, for a message (it may be anything: it was not a valid ID)."""
    return one_line(session_id)[:MAX_ARGUMENT_CHARS] or "''"


def transcript_lines(transcript: Transcript) -> Iterator[str]:
    """The conversation as text: a blank line and a heading line per message, then its
    text; tool calls one line each, where they happened; turns that did not complete say
    how they ended."""
    started = transcript.gap
    if transcript.gap:
        yield HISTORY_CUT
    text: list[str] = []
    for entry in transcript.conversation():
        if isinstance(entry, tuple):
            yield _call_line(*entry)
            continue
        body = entry.body
        if body["kind"] == "terminal":
            if body["status"] != "completed":
                yield f"[turn {body['status']}]"
            continue
        if body["part"] == 0:
            role = "summary of the earlier conversation" if body["kind"] == "summary" else None
            if started:
                yield ""
            started = True
            yield f"{role or body['role']}:"
        text.append(str(body["text"]))
        if body["last_part"]:
            message = without_hidden("".join(text), keep="\n\t").rstrip("\n")
            text.clear()
            if message:
                yield from message.split("\n")


def _call_line(call: ToolCallRecord, is_error: bool | None) -> str:
    arguments = one_line(call.arguments)
    if len(arguments) > MAX_ARGUMENT_CHARS:
        arguments = arguments[: MAX_ARGUMENT_CHARS - 1] + "…"
    outcome = " (failed)" if is_error else ""
    return f"  · {one_line(call.name)} {arguments}{outcome}"
