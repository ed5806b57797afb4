"""``session.rewind`` (RFC-0002 §6.16): its preview and its commit. Blocking.

A rewind goes back to a replay cursor at a turn boundary (``SessionStore.turn_boundary``).
The **preview** reads: the messages after the cursor (they go from the conversation) and
every file a turn changed after it, with what a commit would do to it now
(``checkpoints.plan_files``). The **commit**, under the session's writer lease, changes
the files back when asked (each checked again just before: a file changed outside the
agent since is left alone unless forced), then appends a ``rewind`` record: from then on
the records after the cursor are not the conversation (``projection.effective``), for
replay and for the next turn, though they stay in the file.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from magi_code.dataclass import dataclass
from magi_code.sessions.checkpoints import (
    Checkpoints,
    FileChange,
    PlannedFile,
    RestoreResult,
    file_change_of,
    plan_files,
    restore,
)
from magi_code.sessions.ids import validate_session_id
from magi_code.sessions.projection import effective
from magi_code.sessions.store import SessionStore, WriterLease

# What an answer shows of the plan (its counts cover everything): an answer stays far
# below the frame bound with paths of up to 4,096 bytes.
MAX_SHOWN_FILES: Final = 128
MAX_SHOWN_MESSAGES: Final = 64
MESSAGE_EXCERPT_CHARS: Final = 200
# Files a commit restores at the same time.
RESTORE_THREADS: Final = 16


@dataclass(frozen=True, slots=True)
class RewindPlan:
    session_id: str
    to_seq: int
    # The replay items after the cursor: what leaves the conversation.
    messages: tuple[dict[str, Any], ...]
    files: tuple[PlannedFile, ...]
    # Whether any record of the conversation lies after the cursor.
    anything_after: bool


def plan_rewind(store: SessionStore, session_id: object, cursor: object) -> RewindPlan:
    """The preview. Raises as ``SessionStore.turn_boundary``."""
    name = validate_session_id(session_id)
    to_seq, index = store.turn_boundary(name, cursor)
    items = store.transcript(name).items[index:]
    lines = store.whole_history(name)
    kept = {record.seq for record in effective([record for record, _ in lines])}
    changes: list[FileChange] = []
    anything_after = False
    for record, line in lines:
        if record.seq <= to_seq or record.seq not in kept:
            continue
        anything_after = True
        change = file_change_of(record, line)
        if change is not None:
            changes.append(change)
    messages = tuple(
        {k: v for k, v in item.body.items() if k not in ("part", "last_part")}
        for item in items
        if item.kind != "message" or item.part == 0
    )
    files = tuple(plan_files(changes, Checkpoints(store.session_dir(name))))
    return RewindPlan(name, to_seq, messages, files, anything_after)


def commit_rewind(
    store: SessionStore, lease: WriterLease, cursor: object, files: bool, force: bool
) -> tuple[RewindPlan, list[RestoreResult]]:
    """Plan again under ``lease`` (the session's, held by the caller, with no turn
    running), change the files back when ``files``, then append the ``rewind`` record
    (none when nothing follows the cursor). Raises as ``plan_rewind`` and ``append``."""
    lease.wait_durable(lease.submitted_seq)  # then the history read is authoritative
    plan = plan_rewind(store, lease.session_id, cursor)
    results: list[RestoreResult] = []
    if files and plan.files:
        blobs = Checkpoints(store.session_dir(plan.session_id))
        # Each restore is written and fsynced on its own; side by side, their fsyncs
        # share the filesystem's journal commits.
        with ThreadPoolExecutor(min(RESTORE_THREADS, len(plan.files))) as pool:
            results = list(pool.map(lambda file: restore(file, blobs, force), plan.files))
    if plan.anything_after:
        lease.append({"type": "rewind", "to_seq": plan.to_seq})
    return plan, results


def rewind_answer(
    plan: RewindPlan, results: list[RestoreResult] | None, files: bool
) -> dict[str, Any]:
    """The ``rewind_result`` fields: ``results`` after a commit, ``None`` for a preview
    (then each file's ``state`` is what a commit would do now)."""
    shown = []
    counts: dict[str, int] = {}
    for index, file in enumerate(plan.files):
        state = file.state if results is None else (results[index] if files else "kept")
        counts[state] = counts.get(state, 0) + 1
        if index < MAX_SHOWN_FILES:
            shown.append({"path": file.path, "state": state})
    messages = [
        {**body, "text": str(body["text"])[:MESSAGE_EXCERPT_CHARS]} if "text" in body else body
        for body in plan.messages[:MAX_SHOWN_MESSAGES]
    ]
    return {
        "session_id": plan.session_id,
        "committed": results is not None,
        "messages": messages,
        "message_count": len(plan.messages),
        "files": shown,
        "file_count": len(plan.files),
        "file_states": counts,
    }
