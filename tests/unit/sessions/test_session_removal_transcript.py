"""``SessionStore.transcript`` (what ``sessions show`` renders) and ``SessionStore.remove``
(``sessions rm``) on real files: the replay's own items with the tool calls between them,
and removal only under the writer lease, of nothing that is not this user's."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from magi_code.daemonctl.sessions import HISTORY_CUT, transcript_lines
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.store import (
    STALE_STAGING_SECONDS,
    ForeignEntries,
    SessionStore,
    WriterLease,
    remove_leftovers,
)


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def _call(lease: WriterLease, turn: str, call: str, name: str, error: bool = False) -> None:
    arguments = json.dumps({"path": "a.txt"})
    lease.append(
        {
            "type": "tool_call",
            "turn_id": turn,
            "call_id": call,
            "name": name,
            "arguments": arguments,
        }
    )
    lease.append(
        {
            "type": "tool_result",
            "turn_id": turn,
            "call_id": call,
            "name": name,
            "output": "x",
            "is_error": error,
        }
    )


def test_transcript_is_the_replay_with_the_tool_calls_where_they_ran(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    lease.append({"type": "user", "turn_id": "t1", "text": "old question"})
    _call(lease, "t1", "c0", "summarized_away")
    lease.append({"type": "terminal", "turn_id": "t1", "status": "completed", "assistant_text": ""})
    cutoff = lease.submitted_seq
    lease.append({"type": "user", "turn_id": "t2", "text": "read it"})
    # A reply streamed in increments, cut by a tool call, then the turn was cancelled.
    lease.append({"type": "assistant", "turn_id": "t2", "text": "Read", "continued": True})
    lease.append({"type": "assistant", "turn_id": "t2", "text": "ing.", "continued": True})
    _call(lease, "t2", "c1", "read_file", error=True)
    lease.append({"type": "assistant", "turn_id": "t2", "text": "Gone\x07?"})
    lease.append(
        {"type": "terminal", "turn_id": "t2", "status": "cancelled", "assistant_text": "Gone?"}
    )
    lease.append({"type": "compaction", "summary": "We talked.", "cutoff_seq": cutoff})

    transcript = store.transcript(session)
    replayed = cast(list[dict[str, object]], store.replay(session, None, 32)["events"])
    assert [i.body for i in transcript.items] == [
        {k: v for k, v in e.items() if k != "cursor"} for e in replayed
    ]
    assert list(transcript_lines(transcript)) == [
        "summary of the earlier conversation:",
        "We talked.",
        "",
        "user:",
        "read it",
        "",
        "assistant:",
        "Reading.",
        '  · read_file {"path": "a.txt"} (failed)',
        "",
        "assistant:",
        "Gone?",
        "[turn cancelled]",
    ]


def test_transcript_says_when_history_is_left_out(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    lease.append({"type": "user", "turn_id": "t1", "text": "hi"})
    with (store._root / session / "history.jsonl").open("ab") as fh:
        fh.write(b"not a record\n")
    assert list(transcript_lines(store.transcript(session))) == [HISTORY_CUT, "", "user:", "hi"]


def test_remove_needs_the_lease_and_leaves_nothing(store: SessionStore, session: str) -> None:
    other = store.create()
    with store.acquire_writer_lease(session):
        with pytest.raises(ServiceError) as busy:
            store.remove(session)
        assert busy.value.code is ErrorCode.SESSION_BUSY
    assert store.exists(session)
    store.remove(session)
    assert sorted(os.listdir(store._root)) == [other]
    for call in (store.remove, store.transcript, store.acquire_writer_lease):
        with pytest.raises(ServiceError) as gone:
            call(session)
        assert gone.value.code is ErrorCode.SESSION_UNAVAILABLE
    with pytest.raises(ServiceError) as invalid:
        store.remove("../sessions")
    assert invalid.value.code is ErrorCode.INVALID_SESSION_ID


def test_remove_touches_nothing_it_did_not_make(store: SessionStore, session: str) -> None:
    directory = store._root / session
    (directory / "kept").mkdir()
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    with pytest.raises(ForeignEntries):
        store.remove(session)
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before
    # Not even taken: the lease is free for a service.
    store.acquire_writer_lease(session).release()


def test_what_crashes_left_goes_and_nothing_else(store: SessionStore, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    kept, cut_short = store.create(), store.create()
    # A removal that a crash stopped right after its rename.
    os.rename(root / cut_short, root / f".rm-{cut_short}")
    old, fresh = root / ".new-ses_old", root / ".new-ses_fresh"
    for staging in (old, fresh):  # creates that a crash stopped, and one still running
        staging.mkdir()
        (staging / "history.jsonl").write_text("{}\n")
    before = time.time() - STALE_STAGING_SECONDS - 60
    os.utime(old, (before, before))
    holding = root / ".rm-ses_holding"
    (holding / "notes").mkdir(parents=True)  # a directory: the store never makes one
    (root / ".rm-not a session").mkdir()
    (root / ".new-ses_file").write_text("")
    os.utime(root / ".new-ses_file", (before, before))

    assert remove_leftovers(root) == 2
    assert sorted(os.listdir(root)) == sorted(
        [kept, fresh.name, holding.name, ".rm-not a session", ".new-ses_file"]
    )
    assert (holding / "notes").is_dir()
    assert store.replay(kept, None, 32)["events"] == []
    assert remove_leftovers(tmp_path / "no sessions yet") == 0


def test_a_removal_racing_the_sweep_of_leftovers_still_succeeds(
    store: SessionStore, tmp_path: Path
) -> None:
    # A daemon starting while `sessions rm` runs: the sweep may finish a `.rm-<id>` that
    # its remover is emptying; that removal is still a success.
    root = tmp_path / "sessions"
    sessions = [store.create() for _ in range(60)]
    done = threading.Event()

    def sweep() -> None:
        while not done.is_set():
            remove_leftovers(root)

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    try:
        for session in sessions:
            store.remove(session)
    finally:
        done.set()
        sweeper.join()
    assert os.listdir(root) == []
