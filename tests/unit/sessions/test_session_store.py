"""SessionStore on real files: create, append, replay, cursors, torn tails, windows,
listing bounds (spec: application-service-v1 "Sessions")."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

import orjson
import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import (
    MAX_SESSION_REPLAY_PAGE_BYTES,
)
from magi_code.sessions.records import UserRecord, encode_record
from magi_code.sessions.store import APPEND_LOCK, HISTORY, SessionStore, WriterLease

TS = "2025-01-01T00:00:00.000Z"


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def history(store: SessionStore, session_id: str) -> Path:
    return store._root / session_id / HISTORY


def turn(
    lease: WriterLease, turn_id: str, prompt: str, answer: str, status: str = "completed"
) -> None:
    lease.append({"type": "user", "turn_id": turn_id, "text": prompt})
    if answer:
        lease.append({"type": "assistant", "turn_id": turn_id, "text": answer})
    lease.append(
        {"type": "terminal", "turn_id": turn_id, "status": status, "assistant_text": answer}
    )


def replay_all(store: SessionStore, session_id: str, limit: int = 32) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    after = None
    for _ in range(10_000):
        page = store.replay(session_id, after, limit)
        assert page["resync_required"] is False
        events += page["events"]
        after = page["next_cursor"]
        if not page["truncated"]:
            assert page["next_cursor"] == page["snapshot_cursor"]
            return events
    raise AssertionError("replay did not finish")


def strip(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in e.items() if k != "cursor"} for e in events]


def msg(role: str, text: str, part: int = 0, last: bool = True) -> dict[str, object]:
    return {"kind": "message", "role": role, "text": text, "part": part, "last_part": last}


def term(status: str) -> dict[str, object]:
    return {"kind": "terminal", "status": status}


def test_create_writes_durable_header_and_private_layout(store: SessionStore) -> None:
    session_id = store.create()
    assert store.exists(session_id)
    directory = store._root / session_id
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(p.name for p in store._root.iterdir()) == [session_id]
    lines = history(store, session_id).read_bytes().splitlines()
    header = orjson.loads(lines[0])
    assert header["type"] == "header" and header["seq"] == 0 and header["v"] == 1
    assert header["session_id"] == session_id
    assert stat.S_IMODE(history(store, session_id).stat().st_mode) == 0o600
    empty = store.replay(session_id, None, 32)
    assert empty["events"] == [] and empty["truncated"] is False and empty["gap"] is False
    assert empty["next_cursor"] == empty["snapshot_cursor"]
    # The start cursor is a valid `after` for an empty session.
    again = store.replay(session_id, empty["next_cursor"], 32)
    assert again["resync_required"] is False and again["events"] == []


def test_round_trip_projects_only_the_allowlist(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    lease.append({"type": "user", "turn_id": "t1", "text": "Question"})
    lease.append(
        {"type": "tool_call", "turn_id": "t1", "call_id": "c", "name": "read", "arguments": "{}"}
    )
    lease.append(
        {
            "type": "tool_result",
            "turn_id": "t1",
            "call_id": "c",
            "name": "read",
            "output": "SECRET",
            "is_error": False,
        }
    )
    lease.append({"type": "assistant", "turn_id": "t1", "text": ""})  # tool-only message
    lease.append({"type": "assistant", "turn_id": "t1", "text": "Answer"})
    lease.append(
        {"type": "terminal", "turn_id": "t1", "status": "completed", "assistant_text": "Answer"}
    )
    # A stopped turn that never settled an assistant message keeps its partial text.
    lease.append({"type": "user", "turn_id": "t2", "text": "Again"})
    seq = lease.append(
        {"type": "terminal", "turn_id": "t2", "status": "cancelled", "assistant_text": "Partial"}
    )
    assert seq == 8
    with history(store, session).open("ab") as fh:  # a future record type is ignored
        fh.write(b'{"v":1,"seq":9,"ts":"' + TS.encode() + b'","type":"reasoning","x":"y"}\n')
    assert strip(replay_all(store, session)) == [
        msg("user", "Question"),
        msg("assistant", "Answer"),
        term("completed"),
        msg("user", "Again"),
        msg("assistant", "Partial"),
        term("cancelled"),
    ]
    assert b"SECRET" not in orjson.dumps(store.replay(session, None, 32))
    seqs = [orjson.loads(x)["seq"] for x in history(store, session).read_bytes().splitlines()]
    assert seqs == list(range(10))


def test_compaction_summary_precedes_conversation_after_cutoff(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    turn(lease, "t1", "old question", "old answer")  # seqs 1..3
    lease.append({"type": "user", "turn_id": "t2", "text": "kept"})  # seq 4
    lease.append({"type": "compaction", "summary": "S" * 3000, "cutoff_seq": 3})
    lease.append(
        {"type": "terminal", "turn_id": "t2", "status": "compaction_required", "assistant_text": ""}
    )
    events = strip(replay_all(store, session))
    assert events == [
        {"kind": "summary", "text": "S" * 2048, "part": 0, "last_part": False},
        {"kind": "summary", "text": "S" * 952, "part": 1, "last_part": True},
        msg("user", "kept"),
        term("compaction_required"),
    ]
    context = store.load_context(session)
    assert context.summary == "S" * 3000 and context.cutoff_seq == 3
    assert [r.seq for r in context.records] == [4, 6]
    assert next(iter(context.records)) == UserRecord(4, "t2", "kept")
    assert not context.history_cut and not context.gap


def test_cursor_survives_restart_and_appends_but_not_a_new_checkpoint(
    store: SessionStore, session: str, tmp_path: Path
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turn(lease, "t1", "one", "uno")
    first = store.replay(session, None, 2)
    assert first["truncated"] is True and len(first["events"]) == 2
    saved = first["next_cursor"]
    assert saved == first["events"][-1]["cursor"]
    assert all(len(str(e["cursor"])) <= 128 for e in first["events"])

    restarted = SessionStore(tmp_path / "sessions")
    with restarted.acquire_writer_lease(session) as lease:
        turn(lease, "t2", "two", "dos")
    rest = restarted.replay(session, saved, 32)
    assert rest["resync_required"] is False and rest["gap"] is False
    assert strip(rest["events"]) == [
        term("completed"),
        msg("user", "two"),
        msg("assistant", "dos"),
        term("completed"),
    ]
    end = rest["next_cursor"]
    assert end == rest["snapshot_cursor"] and rest["truncated"] is False
    # Polling the end cursor later yields nothing new, then exactly the new items.
    idle = restarted.replay(session, end, 32)
    assert idle["events"] == [] and idle["next_cursor"] == end
    with restarted.acquire_writer_lease(session) as lease:
        lease.append({"type": "user", "turn_id": "t3", "text": "three"})
        assert strip(restarted.replay(session, end, 32)["events"]) == [msg("user", "three")]
        # A new checkpoint changes the projected prefix: old cursors must resync.
        lease.append({"type": "compaction", "summary": "sum", "cutoff_seq": 6})
    stale = restarted.replay(session, end, 32)
    assert stale["resync_required"] is True and stale["events"] == []
    assert stale["truncated"] is True
    fresh = restarted.replay(session, stale["next_cursor"], 32)
    assert fresh["resync_required"] is False
    assert strip(fresh["events"]) == [
        {"kind": "summary", "text": "sum", "part": 0, "last_part": True},
        msg("user", "three"),
    ]


def test_a_streamed_reply_replays_as_its_whole_text_in_2048_byte_parts(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    def reply(text: str, continued: bool = True) -> None:
        record = {"type": "assistant", "turn_id": "t1", "text": text}
        lease.append({**record, "continued": True} if continued else record)

    lease.append({"type": "user", "turn_id": "t1", "text": "q"})
    for _ in range(3):
        reply("a" * 500)  # increments that each fit one part: parts follow the text
    first = store.replay(session, None, 32)
    assert strip(first["events"]) == [msg("user", "q"), msg("assistant", "a" * 1500)]
    grown_part = first["next_cursor"]  # the last part of the reply still streaming
    reply("b" * 1000)
    second = store.replay(session, None, 32)
    assert strip(second["events"]) == [
        msg("user", "q"),
        msg("assistant", "a" * 1500 + "b" * 548, 0, False),
        msg("assistant", "b" * 452, 1),
    ]
    # The part that grew was accepted shorter: a cursor naming it resyncs, never skips.
    stale = store.replay(session, grown_part, 32)
    assert stale["resync_required"] is True and stale["events"] == []
    whole_part = second["events"][1]["cursor"]  # a full part: more text never changes it
    last_part = second["next_cursor"]
    reply("", continued=False)  # the reply ends with nothing left: nothing changes
    lease.append({"type": "terminal", "turn_id": "t1", "status": "completed", "assistant_text": ""})
    after_whole = store.replay(session, whole_part, 32)
    assert after_whole["resync_required"] is False
    assert strip(after_whole["events"]) == [msg("assistant", "b" * 452, 1), term("completed")]
    after_last = store.replay(session, last_part, 32)
    assert strip(after_last["events"]) == [term("completed")]


def test_a_reply_cut_mid_stream_is_one_whole_message_with_or_without_its_terminal(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    lease.append({"type": "user", "turn_id": "t1", "text": "q"})
    for tick in range(3):
        lease.append(
            {"type": "assistant", "turn_id": "t1", "text": f"tick{tick:02d} ", "continued": True}
        )
    cut = [msg("user", "q"), msg("assistant", "tick00 tick01 tick02 ")]
    assert strip(replay_all(store, session)) == cut
    saved = store.replay(session, None, 32)["next_cursor"]
    # The interrupted-turn repair (or the next turn) adds its items; no empty part.
    lease.append(
        {"type": "terminal", "turn_id": "t1", "status": "failed", "assistant_text": "tick00 "}
    )
    assert strip(replay_all(store, session)) == [*cut, term("failed")]
    assert strip(store.replay(session, saved, 32)["events"]) == [term("failed")]


@pytest.mark.parametrize("after", ["", "garbage", "!!!!", "AAAA", "é", "A" * 128])
def test_unmatched_cursor_requests_resync_from_the_start(
    store: SessionStore, session: str, lease: WriterLease, after: str
) -> None:
    turn(lease, "t1", "q", "a")
    page = store.replay(session, after, 32)
    assert page["resync_required"] is True and page["events"] == []
    start = store.replay(session, page["next_cursor"], 32)
    assert strip(start["events"]) == [msg("user", "q"), msg("assistant", "a"), term("completed")]


def test_cursor_from_another_session_requires_resync(store: SessionStore, session: str) -> None:
    other = store.create()
    for sid in (session, other):
        with store.acquire_writer_lease(sid) as lease:
            turn(lease, "t", "same", "same")
    cursor = store.replay(other, None, 1)["next_cursor"]
    assert store.replay(session, cursor, 32)["resync_required"] is True


@pytest.mark.parametrize("after", [1, ["x"], "A" * 129, "é" * 65])
def test_malformed_after_is_invalid_payload(
    store: SessionStore, session: str, after: object
) -> None:
    with pytest.raises(ServiceError) as info:
        store.replay(session, after, 32)
    assert info.value.code is ErrorCode.INVALID_PAYLOAD


@pytest.mark.parametrize(
    ("limit", "code"),
    [
        (0, ErrorCode.INVALID_PAYLOAD),
        (-1, ErrorCode.INVALID_PAYLOAD),
        (True, ErrorCode.INVALID_PAYLOAD),
        ("5", ErrorCode.INVALID_PAYLOAD),
        (None, ErrorCode.INVALID_PAYLOAD),
        (1.5, ErrorCode.INVALID_PAYLOAD),
        (33, ErrorCode.LIMIT_EXCEEDED),
    ],
)
def test_page_limits_outside_1_to_32_are_rejected(
    store: SessionStore, session: str, limit: object, code: ErrorCode
) -> None:
    for call in (
        lambda: store.replay(session, None, limit),
        lambda: store.list_sessions(None, limit),
    ):
        with pytest.raises(ServiceError) as info:
            call()
        assert info.value.code is code


def test_missing_or_unsafe_sessions(store: SessionStore, session: str) -> None:
    missing = "ses_doesnotexist"
    for call in (
        lambda: store.replay(missing, None, 32),
        lambda: store.acquire_writer_lease(missing),
        lambda: store.load_context(missing),
    ):
        with pytest.raises(ServiceError) as info:
            call()
        assert info.value.code is ErrorCode.SESSION_UNAVAILABLE
    assert store.exists(missing) is False
    with pytest.raises(ServiceError) as bad:
        store.replay("../" + session, None, 32)
    assert bad.value.code is ErrorCode.INVALID_SESSION_ID
    # A symlinked session directory is not followed.
    (store._root / "ses_link").symlink_to(store._root / session)
    with pytest.raises(ServiceError) as link:
        store.replay("ses_link", None, 32)
    assert link.value.code is ErrorCode.SESSION_UNAVAILABLE


def test_replay_is_read_only(store: SessionStore, session: str, lease: WriterLease) -> None:
    turn(lease, "t", "q", "a")
    directory = store._root / session
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    store.replay(session, None, 32)
    store.load_context(session)
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before


def test_second_lease_in_same_process_is_busy_and_release_is_idempotent(
    store: SessionStore, session: str
) -> None:
    first = store.acquire_writer_lease(session)
    with pytest.raises(ServiceError) as info:
        store.acquire_writer_lease(session)
    assert info.value.code is ErrorCode.SESSION_BUSY
    # Replay needs no lease and works while one is held.
    assert store.replay(session, None, 32)["resync_required"] is False
    first.release()
    first.release()
    with pytest.raises(ServiceError) as closed:
        first.append({"type": "user", "turn_id": "t", "text": "x"})
    assert closed.value.code is ErrorCode.SESSION_UNAVAILABLE
    store.acquire_writer_lease(session).release()


def test_replay_reports_busy_while_an_append_holds_the_lock(
    store: SessionStore, session: str
) -> None:
    fd = os.open(store._root / session / APPEND_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(ServiceError) as info:
            store.replay(session, None, 32)
        assert info.value.code is ErrorCode.SESSION_BUSY
    finally:
        os.close(fd)
    assert store.replay(session, None, 32)["gap"] is False


def test_append_rejects_header_and_invalid_records(lease: WriterLease) -> None:
    with pytest.raises(ValueError):
        lease.append({"type": "header", "session_id": "x", "created_at": TS})
    with pytest.raises(ValueError):
        lease.append({"type": "user", "text": "no turn"})
    with pytest.raises(ServiceError) as info:
        lease.append({"type": "user", "turn_id": "t", "text": "x" * (1024 * 1024)})
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED
    assert lease.append({"type": "user", "turn_id": "t", "text": "ok"}) == 1


def test_torn_tail_is_a_gap_then_repaired_by_the_next_writer(
    store: SessionStore, session: str
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turn(lease, "t1", "q1", "a1")
    path = history(store, session)
    torn = encode_record({"type": "user", "turn_id": "t2", "text": "lost"}, 4, TS)[:-7]
    with path.open("ab") as fh:
        fh.write(torn)  # crash mid-append: no newline
    page = store.replay(session, None, 32)
    assert page["gap"] is True
    assert strip(page["events"]) == [msg("user", "q1"), msg("assistant", "a1"), term("completed")]
    context = store.load_context(session)
    assert context.gap is True and len([*context.records]) == 3
    saved = page["next_cursor"]

    with store.acquire_writer_lease(session) as lease:
        assert lease.append({"type": "user", "turn_id": "t2", "text": "q2"}) == 4
    assert path.read_bytes().endswith(b'"text":"q2"}\n')
    after = store.replay(session, saved, 32)
    assert after["resync_required"] is False and after["gap"] is False
    assert strip(after["events"]) == [msg("user", "q2")]


def test_malformed_middle_line_is_skipped_with_gap(store: SessionStore, session: str) -> None:
    with store.acquire_writer_lease(session) as lease:
        lease.append({"type": "user", "turn_id": "t", "text": "q"})
    with history(store, session).open("ab") as fh:
        fh.write(b'{"v":1,"seq":2,"type":"user"\n')
    with store.acquire_writer_lease(session) as lease:
        assert lease.append({"type": "assistant", "turn_id": "t", "text": "a"}) == 2
    page = store.replay(session, None, 32)
    assert page["gap"] is True
    assert strip(page["events"]) == [msg("user", "q"), msg("assistant", "a")]


def _fill(path: Path, first_seq: int, count: int, text: str) -> int:
    with path.open("ab") as fh:
        for offset in range(count):
            seq = first_seq + offset
            fh.write(encode_record({"type": "user", "turn_id": f"t{seq}", "text": text}, seq, TS))
    return first_seq + count


def test_history_beyond_the_2mib_window_replays_only_the_tail(
    store: SessionStore, session: str
) -> None:
    path = history(store, session)
    next_seq = _fill(path, 1, 700, "x" * 4000)  # ~2.8 MiB
    page = store.replay(session, None, 32)
    assert page["gap"] is True
    # Only whole records from the last 2 MiB are read; the partial first line is skipped.
    record_bytes = len(
        encode_record({"type": "user", "turn_id": "t100", "text": "x" * 4000}, 100, TS)
    )
    in_window = (2 * 1024 * 1024) // record_bytes
    context = store.load_context(session)
    assert context.history_cut is True
    assert [r.seq for r in context.records] == list(range(next_seq - in_window, next_seq))
    first = page["events"][0]
    assert first["text"] == "x" * 2048 and first["part"] == 0
    tail = store.replay(session, page["next_cursor"], 32)
    assert tail["resync_required"] is False and tail["gap"] is True
    # A checkpoint whose cutoff reaches into the window closes the gap.
    with store.acquire_writer_lease(session) as lease:
        lease.append({"type": "compaction", "summary": "all so far", "cutoff_seq": next_seq - 2})
    page = store.replay(session, None, 32)
    assert page["gap"] is False
    assert [e["kind"] for e in page["events"]] == ["summary", "message", "message"]


def test_pages_never_exceed_16_kib_even_with_escaped_text(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    lease.append({"type": "user", "turn_id": "t", "text": "\x01" * 6000})
    lease.append({"type": "assistant", "turn_id": "t", "text": '"' * 5000})
    after = None
    count = 0
    while True:
        page = store.replay(session, after, 32)
        assert len(orjson.dumps(page)) <= MAX_SESSION_REPLAY_PAGE_BYTES
        assert page["events"]
        count += len(page["events"])
        after = page["next_cursor"]
        if not page["truncated"]:
            break
    assert count == 3 + 3


def test_list_pages_by_id_with_titles_and_timestamps(store: SessionStore) -> None:
    ids = sorted(store.create() for _ in range(5))
    with store.acquire_writer_lease(ids[1]) as lease:
        lease.append({"type": "user", "turn_id": "t", "text": "  \nFirst\x07 line\nsecond"})
        lease.append({"type": "user", "turn_id": "u", "text": "not the title"})
    (store._root / "notes.txt").write_text("x")
    (store._root / ".new-ses_zzzz").mkdir()
    (store._root / "ses_file").write_text("x")

    first = store.list_sessions(None, 2)
    assert [s["session_id"] for s in first["sessions"]] == ids[:2]
    assert first["truncated"] is True and first["next_after"] == ids[1]
    assert first["incomplete"] is False
    titled = first["sessions"][1]
    assert titled["title"] == "First line"
    assert first["sessions"][0]["title"] is None
    stamp = titled["updated_at"]
    assert isinstance(stamp, str) and stamp.endswith("Z") and stamp[10] == "T"

    second = store.list_sessions(first["next_after"], 2)
    assert [s["session_id"] for s in second["sessions"]] == ids[2:4]
    last = store.list_sessions(second["next_after"], 2)
    assert [s["session_id"] for s in last["sessions"]] == ids[4:]
    assert last["truncated"] is False and last["next_after"] is None
    assert store.list_sessions(None, 32)["truncated"] is False


def test_list_marks_unreadable_candidates_incomplete(store: SessionStore) -> None:
    good = store.create()
    broken = store.create()
    history(store, broken).unlink()
    weird = store.create()
    (store._root / weird / "meta.json").write_bytes(b"{not json")
    page = store.list_sessions(None, 32)
    assert page["incomplete"] is True
    listed = {s["session_id"]: s["title"] for s in page["sessions"]}
    assert listed == {good: None, weird: None}


def test_list_validates_after_and_handles_missing_root(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "nothing-here")
    assert store.list_sessions(None, 32) == {
        "sessions": [],
        "next_after": None,
        "truncated": False,
        "incomplete": False,
    }
    for after in ("../x", "", 5):
        with pytest.raises(ServiceError) as info:
            store.list_sessions(after, 32)
        assert info.value.code is ErrorCode.INVALID_SESSION_ID


def test_window_reads_at_most_100000_records(store: SessionStore, session: str) -> None:
    with history(store, session).open("ab") as fh:
        fh.write(b"\n" * 150_000)  # blank lines count as (malformed) records
        fh.write(encode_record({"type": "user", "turn_id": "t", "text": "last"}, 1, TS))
    page = store.replay(session, None, 32)
    assert page["gap"] is True
    assert strip(page["events"]) == [msg("user", "last")]
    assert store.load_context(session).history_cut is True
