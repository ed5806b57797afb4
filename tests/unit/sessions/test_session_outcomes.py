"""Turn outcomes from durable history: optional record fields, whole-file scans, and the
repair of a turn whose process died mid-turn (real files under tmp_path)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.idempotency import valid_idempotency_key
from magi_code.sessions import outcomes
from magi_code.sessions.fileio import HISTORY
from magi_code.sessions.outcomes import TurnOutcome, iter_lines
from magi_code.sessions.records import (
    TerminalRecord,
    UserRecord,
    decode_line,
    encode_record,
)
from magi_code.sessions.store import SessionStore, WriterLease

TS = "2025-01-01T00:00:00.000Z"
TS_UNIX = 1735689600.0


@pytest.fixture
def store(home: Path) -> SessionStore:
    return SessionStore(home / "sessions")


def history(store: SessionStore, session_id: str) -> Path:
    return store._root / session_id / HISTORY


def user(turn_id: str, text: str, key: str | None = None) -> dict[str, object]:
    record: dict[str, object] = {"type": "user", "turn_id": turn_id, "text": text}
    if key is not None:
        record["idempotency_key"] = key
    return record


def terminal(
    turn_id: str, status: str, text: str, sequence: int | None = None
) -> dict[str, object]:
    record: dict[str, object] = {
        "type": "terminal",
        "turn_id": turn_id,
        "status": status,
        "assistant_text": text,
    }
    if sequence is not None:
        record["sequence"] = sequence
    return record


def assistant(turn_id: str, text: str) -> dict[str, object]:
    return {"type": "assistant", "turn_id": turn_id, "text": text}


def replay_events(store: SessionStore, session_id: str) -> tuple[list[dict[str, object]], bool]:
    events: list[dict[str, object]] = []
    after: object = None
    gap = False
    while True:
        page = store.replay(session_id, after, 32)
        assert page["resync_required"] is False
        assert isinstance(page["events"], list)
        events += [{k: v for k, v in e.items() if k != "cursor"} for e in page["events"]]
        gap = gap or bool(page["gap"])
        after = page["next_cursor"]
        if not page["truncated"]:
            return events, gap


# -- record fields ---------------------------------------------------------------------


def test_optional_fields_round_trip_and_absent_fields_encode_as_before() -> None:
    line = encode_record(user("t", "hi", "key-1.a:b_C"), 1, TS)
    assert orjson.loads(line)["idempotency_key"] == "key-1.a:b_C"
    assert decode_line(line[:-1]) == UserRecord(1, "t", "hi", "key-1.a:b_C")
    line = encode_record(terminal("t", "completed", "a", sequence=0), 2, TS)
    assert decode_line(line[:-1]) == TerminalRecord(2, "t", "completed", "a", 0)
    # Without the new fields (or with None) a record is byte-identical to the old format.
    old_user = (
        b'{"v":1,"seq":1,"ts":"' + TS.encode() + b'","type":"user","turn_id":"t","text":"hi"}\n'
    )
    assert encode_record(user("t", "hi"), 1, TS) == old_user
    assert encode_record({**user("t", "hi"), "idempotency_key": None}, 1, TS) == old_user
    old_terminal = (
        b'{"v":1,"seq":2,"ts":"' + TS.encode() + b'","type":"terminal","turn_id":"t",'
        b'"status":"failed","assistant_text":"p"}\n'
    )
    assert encode_record(terminal("t", "failed", "p"), 2, TS) == old_terminal
    assert encode_record({**terminal("t", "failed", "p"), "sequence": None}, 2, TS) == old_terminal
    # Old lines decode with the defaults.
    assert decode_line(old_user[:-1]) == UserRecord(1, "t", "hi", None)
    assert decode_line(old_terminal[:-1]) == TerminalRecord(2, "t", "failed", "p", None)
    # A failed turn's reason round-trips; a reason that is not a string is malformed.
    why = {"failure": "provider_auth_failed", "remedy": "check the key in K"}
    line = encode_record({**terminal("t", "failed", "p", sequence=3), **why}, 2, TS)
    assert decode_line(line[:-1]) == TerminalRecord(2, "t", "failed", "p", 3, **why)
    bad = orjson.loads(line) | {"failure": 401}
    assert decode_line(orjson.dumps(bad)) is None


@pytest.mark.parametrize(
    "fields",
    [
        user("t", "x", ""),
        user("t", "x", "k" * 65),
        user("t", "x", "has space"),
        user("t", "x", "slash/no"),
        user("t", "x", "é"),
        user("t", "x", "key\n"),
        {**user("t", "x"), "idempotency_key": 5},
        {**terminal("t", "completed", ""), "sequence": -1},
        {**terminal("t", "completed", ""), "sequence": True},
        {**terminal("t", "completed", ""), "sequence": 1.0},
        {**terminal("t", "completed", ""), "sequence": "1"},
    ],
)
def test_invalid_optional_fields_are_refused_on_write_and_malformed_on_read(
    fields: dict[str, object],
) -> None:
    with pytest.raises(ValueError):
        encode_record(fields, 3, TS)
    line = orjson.dumps({"v": 1, "seq": 3, "ts": TS, **fields})
    assert decode_line(line) is None


def test_optional_fields_belong_to_their_own_type() -> None:
    for fields in (
        {**user("t", "x"), "sequence": 1},
        {**assistant("t", "x"), "idempotency_key": "k"},
    ):
        with pytest.raises(ValueError):
            encode_record(fields, 3, TS)


def test_idempotency_key_alphabet() -> None:
    assert valid_idempotency_key("a" * 64)
    assert valid_idempotency_key("A-z_0.9:")
    for bad in ["", "a" * 65, "a b", "a\n", "\u0661", None, 1]:
        assert not valid_idempotency_key(bad), bad


# -- turn_outcome / find_turn_by_key -----------------------------------------------------


def test_outcome_of_a_completed_turn(store: SessionStore, session: str, lease: WriterLease) -> None:
    before = time.time()
    lease.append(user("t1", "question", "idem-1"))
    lease.append(assistant("t1", "one "))
    lease.append(assistant("t1", "two"))
    lease.append(terminal("t1", "completed", "one two", sequence=7))
    outcome = store.turn_outcome(session, "t1")
    assert outcome is not None
    assert outcome.accepted_at is not None and before - 1 <= outcome.accepted_at <= time.time()
    assert outcome == TurnOutcome("t1", "completed", "one two", 7, "idem-1", outcome.accepted_at)
    assert store.find_turn_by_key(session, "idem-1") == outcome
    # Replay output does not change with the new fields.
    events, gap = replay_events(store, session)
    assert not gap
    assert [e["kind"] for e in events] == ["message", "message", "message", "terminal"]


def test_a_steer_record_is_inside_its_turn(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    # RFC-0002 §6.10: the steer's user record, where it entered; the turn starts before.
    line = encode_record({**user("t1", "more"), "steer": True}, 1, TS)
    assert decode_line(line[:-1]) == UserRecord(1, "t1", "more", None, True)
    assert encode_record({**user("t1", "q"), "steer": None}, 1, TS) == encode_record(
        user("t1", "q"), 1, TS
    )
    assert decode_line(orjson.dumps(orjson.loads(line) | {"steer": "yes"})) is None
    lease.append(user("t1", "question", "idem-1"))
    lease.append(assistant("t1", "before "))
    lease.append({**user("t1", "steered"), "steer": True})
    outcome = store.turn_outcome(session, "t1")
    assert outcome is not None and outcome.status is None
    assert outcome.assistant_text == "before " and outcome.idempotency_key == "idem-1"
    lease.append(assistant("t1", "after"))
    lease.append(terminal("t1", "completed", "before after"))
    assert store.find_turn_by_key(session, "idem-1") == store.turn_outcome(session, "t1")
    events, _ = replay_events(store, session)
    assert [(e["kind"], e.get("role"), e.get("text")) for e in events] == [
        ("message", "user", "question"),
        ("message", "assistant", "before "),
        ("message", "user", "steered"),
        ("message", "assistant", "after"),
        ("terminal", None, None),
    ]


def test_unknown_turns_keys_and_sessions(store: SessionStore, session: str) -> None:
    with store.acquire_writer_lease(session) as lease:
        lease.append(user("t1", "q", "k1"))
        lease.append(terminal("t1", "completed", "a"))
    assert store.turn_outcome(session, "nope") is None
    assert store.find_turn_by_key(session, "other") is None
    assert store.find_turn_by_key(session, "not a key") is None
    assert store.close_interrupted_turn(session, "nope") is None
    calls: tuple[Callable[[], object], ...] = (
        lambda: store.turn_outcome("ses_missing", "t1"),
        lambda: store.find_turn_by_key("ses_missing", "k1"),
        lambda: store.find_turn_by_key("ses_missing", "not a key"),
        lambda: store.close_interrupted_turn("ses_missing", "t1"),
    )
    for call in calls:
        with pytest.raises(ServiceError) as missing:
            call()
        assert missing.value.code is ErrorCode.SESSION_UNAVAILABLE
    calls = (
        lambda: store.turn_outcome("../" + session, "t1"),
        lambda: store.find_turn_by_key("../" + session, "k1"),
        lambda: store.close_interrupted_turn("../" + session, "t1"),
    )
    for call in calls:
        with pytest.raises(ServiceError) as invalid:
            call()
        assert invalid.value.code is ErrorCode.INVALID_SESSION_ID
    # Neither a symlinked session directory nor a symlinked history is followed.
    (store._root / "ses_link").symlink_to(store._root / session)
    with pytest.raises(ServiceError) as link:
        store.turn_outcome("ses_link", "t1")
    assert link.value.code is ErrorCode.SESSION_UNAVAILABLE
    other = store.create()
    history(store, other).unlink()
    history(store, other).symlink_to(history(store, session))
    with pytest.raises(ServiceError) as file_link:
        store.turn_outcome(other, "t1")
    assert file_link.value.code is ErrorCode.SESSION_UNAVAILABLE


def test_find_turn_by_key_returns_the_newest_match(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    lease.append(user("t1", "first", "same"))
    lease.append(terminal("t1", "failed", "", sequence=3))
    lease.append(user("t2", "other", "different"))
    lease.append(terminal("t2", "completed", "x", sequence=4))
    lease.append(user("t3", "retry", "same"))
    lease.append(assistant("t3", "partial"))
    # A late record of the older turn does not leak into the newer one.
    lease.append(assistant("t1", "late"))
    found = store.find_turn_by_key(session, "same")
    assert found is not None
    assert (found.turn_id, found.status, found.assistant_text) == ("t3", None, "partial")
    assert (found.sequence, found.idempotency_key) == (None, "same")
    first = store.turn_outcome(session, "t1")
    assert first is not None and (first.status, first.sequence) == ("failed", 3)
    assert first.assistant_text == ""  # the terminal's text, not the late record


def test_old_records_without_the_new_fields_still_work(store: SessionStore, session: str) -> None:
    path = history(store, session)
    with path.open("ab") as fh:
        fh.write(
            b'{"v":1,"seq":1,"ts":"' + TS.encode() + b'","type":"user","turn_id":"t","text":"q"}\n'
        )
        fh.write(b'{"v":1,"seq":2,"ts":"bogus","type":"assistant","turn_id":"t","text":"a"}\n')
        fh.write(
            b'{"v":1,"seq":3,"type":"terminal","turn_id":"t","status":"completed",'
            b'"assistant_text":"a"}\n'
        )
        fh.write(b'{"v":1,"seq":4,"ts":"no time","type":"user","turn_id":"u","text":"q"}\n')
        fh.write(b'{"v":1,"seq":5,"type":"user","turn_id":"w","text":"q"}\n')
    assert store.turn_outcome(session, "t") == TurnOutcome(
        "t", "completed", "a", None, None, TS_UNIX
    )
    no_ts = store.turn_outcome(session, "u")
    assert no_ts is not None and no_ts.accepted_at is None and no_ts.status is None
    absent = store.turn_outcome(session, "w")
    assert absent is not None and absent.accepted_at is None


def test_scan_skips_what_replay_skips(store: SessionStore, session: str) -> None:
    path = history(store, session)
    with path.open("ab") as fh:
        fh.write(encode_record(user("t", "q", "k"), 1, TS))
        fh.write(b'{"v":1,"seq":2,"type":"terminal"\n')  # malformed
        fh.write(encode_record(terminal("t", "completed", "stale"), 1, TS))  # seq not increasing
        fh.write(b"\n\n")
        fh.write(encode_record(assistant("t", "kept"), 2, TS))
    outcome = store.turn_outcome(session, "t")
    assert outcome is not None and (outcome.status, outcome.assistant_text) == (None, "kept")
    events, gap = replay_events(store, session)
    assert gap and [e.get("role") for e in events] == ["user", "assistant"]


def test_history_larger_than_the_replay_window_still_finds_an_early_turn(
    store: SessionStore, session: str
) -> None:
    path = history(store, session)
    with path.open("ab") as fh:
        fh.write(encode_record(user("early", "q", "early-key"), 1, TS))
        fh.write(encode_record(assistant("early", "a"), 2, TS))
        fh.write(encode_record(terminal("early", "completed", "a", sequence=9), 3, TS))
        # An over-long line (no append could write it) is skipped without holding it whole.
        fh.write(b'{"v":1,"seq":4,"type":"user","turn_id":"big","text":"' + b"y" * 1_100_000)
        fh.write(b'"}\n')
        seq = 5
        for _ in range(700):  # ~2.8 MiB
            fh.write(encode_record(user(f"t{seq}", "x" * 4000), seq, TS))
            seq += 1
    assert path.stat().st_size > 3 * 1024 * 1024
    assert store.load_context(session).history_cut is True
    assert store.turn_outcome(session, "early") == TurnOutcome(
        "early", "completed", "a", 9, "early-key", TS_UNIX
    )
    assert store.find_turn_by_key(session, "early-key") is not None
    assert store.turn_outcome(session, "big") is None
    last = store.turn_outcome(session, f"t{seq - 1}")
    assert last is not None and last.status is None


def test_iter_lines_across_chunk_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outcomes, "SCAN_CHUNK_BYTES", 7)
    lines = [b"", b"a", b"bbbbbbb", b"c" * 20, b"d" * 21, b"eeeeee", b"f" * 50, b"", b"g" * 8]
    path = tmp_path / "lines"
    path.write_bytes(b"\n".join(lines) + b"\ntorn")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert list(iter_lines(fd, size, 20)) == [x for x in lines if len(x) <= 20]
        assert list(iter_lines(fd, 3, 20)) == [b"", b"a"]
        assert list(iter_lines(fd, 2, 20)) == [b""]  # "a" without its newline is torn
    finally:
        os.close(fd)


# -- close_interrupted_turn --------------------------------------------------------------


def crashed_turn(store: SessionStore, session: str) -> Path:
    """t1 completed; t2 has user + assistant records and a torn tail, but no terminal."""
    with store.acquire_writer_lease(session) as lease:
        lease.append(user("t1", "q1", "k1"))
        lease.append(assistant("t1", "a1"))
        lease.append(terminal("t1", "completed", "a1", sequence=5))
        lease.append(user("t2", "q2", "k2"))
        lease.append(assistant("t2", "partial one, "))
        lease.append(assistant("t2", "partial two"))
    path = history(store, session)
    # The process died while appending the next assistant record: cut it mid-line.
    with path.open("ab") as fh:
        fh.write(encode_record(assistant("t2", "never acknowledged"), 7, TS)[:-9])
    return path


def test_interrupted_turn_is_closed_as_failed_and_replays_like_any_failed_turn(
    store: SessionStore, session: str
) -> None:
    path = crashed_turn(store, session)
    interrupted = store.turn_outcome(session, "t2")
    assert interrupted is not None
    assert (interrupted.status, interrupted.sequence) == (None, None)
    assert interrupted.assistant_text == "partial one, partial two"
    assert interrupted.idempotency_key == "k2"
    assert store.find_turn_by_key(session, "k2") == interrupted
    assert replay_events(store, session)[1] is True  # the torn tail is a gap

    closed = store.close_interrupted_turn(session, "t2")
    assert closed == TurnOutcome(
        "t2", "failed", "partial one, partial two", None, "k2", interrupted.accepted_at
    )
    assert store.turn_outcome(session, "t2") == closed
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the torn tail was truncated before the append
    last = orjson.loads(lines[-2])
    assert last["seq"] == 7 and "sequence" not in last
    assert decode_line(lines[-2]) == TerminalRecord(7, "t2", "failed", "partial one, partial two")

    events, gap = replay_events(store, session)
    assert not gap
    assert events[-4:] == [
        {"kind": "message", "role": "user", "text": "q2", "part": 0, "last_part": True},
        {
            "kind": "message",
            "role": "assistant",
            "text": "partial one, ",
            "part": 0,
            "last_part": True,
        },
        {
            "kind": "message",
            "role": "assistant",
            "text": "partial two",
            "part": 0,
            "last_part": True,
        },
        {"kind": "terminal", "status": "failed"},
    ]
    # The same turn failed by a live daemon replays identically.
    reference = store.create()
    with store.acquire_writer_lease(reference) as lease:
        lease.append(user("t1", "q1", "k1"))
        lease.append(assistant("t1", "a1"))
        lease.append(terminal("t1", "completed", "a1", sequence=5))
        lease.append(user("t2", "q2", "k2"))
        lease.append(assistant("t2", "partial one, "))
        lease.append(assistant("t2", "partial two"))
        lease.append(terminal("t2", "failed", "partial one, partial two", sequence=11))
    assert replay_events(store, reference) == (events, False)

    # Closing again (or closing a completed turn) writes nothing.
    size, mtime = path.stat().st_size, path.stat().st_mtime_ns
    assert store.close_interrupted_turn(session, "t2") == closed
    done = store.close_interrupted_turn(session, "t1")
    assert done is not None and (done.status, done.sequence) == ("completed", 5)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (size, mtime)


def test_interrupted_turn_without_assistant_text(store: SessionStore, session: str) -> None:
    with store.acquire_writer_lease(session) as lease:
        lease.append(user("t", "q"))
    closed = store.close_interrupted_turn(session, "t")
    assert closed is not None and (closed.status, closed.assistant_text) == ("failed", "")
    events, gap = replay_events(store, session)
    assert not gap and events[-1] == {"kind": "terminal", "status": "failed"}
    assert len(events) == 2


def test_close_interrupted_turn_does_not_wait_for_a_held_lease(
    store: SessionStore, session: str
) -> None:
    path = crashed_turn(store, session)
    held = store.acquire_writer_lease(session)
    try:
        started = time.monotonic()
        with pytest.raises(ServiceError) as info:
            store.close_interrupted_turn(session, "t2")
        assert info.value.code is ErrorCode.SESSION_BUSY
        assert time.monotonic() - started < 1.0
        # A turn that already has its terminal needs no lease.
        done = store.close_interrupted_turn(session, "t1")
        assert done is not None and done.status == "completed"
        still = store.turn_outcome(session, "t2")
        assert still is not None and still.status is None
    finally:
        held.release()
    assert path.read_bytes().endswith(b"\n")  # the held lease repaired the tail itself
    closed = store.close_interrupted_turn(session, "t2")
    assert closed is not None and closed.status == "failed"


def test_close_with_text_too_large_for_one_record_keeps_replay_intact(
    store: SessionStore, session: str
) -> None:
    with store.acquire_writer_lease(session) as lease:
        lease.append(user("t", "q"))
        lease.append(assistant("t", "a" * 700_000))
        lease.append(assistant("t", "b" * 700_000))
    closed = store.close_interrupted_turn(session, "t")
    assert closed is not None and (closed.status, closed.assistant_text) == ("failed", "")
    assert store.turn_outcome(session, "t") == closed
    events, gap = replay_events(store, session)
    assert not gap and events[-1] == {"kind": "terminal", "status": "failed"}
    assert "".join(str(e["text"]) for e in events if e.get("role") == "assistant") == (
        "a" * 700_000 + "b" * 700_000
    )


def test_close_interrupted_turn_under_a_lease_the_caller_holds(
    store: SessionStore, session: str
) -> None:
    path = crashed_turn(store, session)
    with store.acquire_writer_lease(session) as held:
        closed = store.close_interrupted_turn(session, "t2", held)
        assert closed is not None and closed.status == "failed"
        # Written under that lease: the next record it appends follows the terminal.
        seq = held.append(user("t3", "q3"))
    assert decode_line(path.read_bytes().split(b"\n")[-3]) == TerminalRecord(
        7, "t2", "failed", "partial one, partial two"
    )
    assert seq == 8


def test_taking_the_lease_closes_only_a_latest_turn_left_without_terminal(
    store: SessionStore, session: str
) -> None:
    with store.acquire_writer_lease(session) as lease:
        assert store.close_last_interrupted_turn(lease) is None  # no turn at all
    crashed_turn(store, session)
    with store.acquire_writer_lease(session) as lease:
        closed = store.close_last_interrupted_turn(lease)
        assert closed is not None and (closed.turn_id, closed.status) == ("t2", "failed")
        assert store.close_last_interrupted_turn(lease) is None  # it has its terminal now
        # A dead turn followed by a later turn is not the latest: left for attach.
        lease.append(user("t3", "q3"))
        lease.append(user("t4", "q4"))
        lease.append(terminal("t4", "completed", "", sequence=1))
        assert store.close_last_interrupted_turn(lease) is None
    still = store.turn_outcome(session, "t3")
    assert still is not None and still.status is None


def test_taking_the_lease_closes_a_latest_turn_that_starts_before_the_window(
    store: SessionStore, session: str
) -> None:
    with store.acquire_writer_lease(session) as lease:
        lease.append(user("t", "q"))
        for letter in "abcd":  # over 2 MiB: the window holds none of the turn's user record
            lease.append({**assistant("t", letter * 700_000), "continued": True})
    with store.acquire_writer_lease(session) as lease:
        closed = store.close_last_interrupted_turn(lease)
    assert closed is not None and (closed.turn_id, closed.status) == ("t", "failed")
