"""The per-turn replay buffer behind snapshot/attach (RFC-0002 §6)."""

from __future__ import annotations

import msgpack
import orjson
import pytest

from magi_code.core.journal import (
    MAX_FINISHED_BYTES,
    MAX_FINISHED_TURNS,
    MAX_TURN_EVENTS,
    RETAIN_SECONDS,
    SNAPSHOT_PAGE_BYTES,
    BadCursor,
    SnapshotQuery,
    TurnJournal,
)
from magi_code.core.output import TurnEvent
from tests.support.turn_events import info
from tests.support.turn_events import turn_event as _event


def test_attach_returns_exactly_the_events_after_the_sequence_then_follows_live() -> None:
    journal = TurnJournal()
    journal.record(_event("turn.started", 0))
    for i in range(1, 4):
        journal.record(_event("turn.assistant_delta", i, text=f"x{i}"))
    live: list[TurnEvent] = []
    answer = journal.attach("t1", 1, live.append)
    assert answer is not None
    status, events = answer
    assert status == "attached"
    assert [e.sequence for e in events] == [2, 3]
    journal.record(_event("turn.terminal", 4, status="completed", assistant_text="x1x2x3"))
    assert [e.sequence for e in live] == [4]
    snap = journal.snapshot()[0][0]
    assert snap["status"] == "completed" and snap["assistant_text"] == "x1x2x3"
    # The text is carried once: the terminal item holds everything else.
    assert "assistant_text" not in snap["terminal"] and snap["terminal"]["sequence"] == 4


def test_evicted_events_yield_an_explicit_resync() -> None:
    journal = TurnJournal()
    for i in range(MAX_TURN_EVENTS + 10):
        journal.record(_event("turn.assistant_delta", i, text="y"))
    answer = journal.attach("t1", 3, lambda _: None)
    assert answer is not None and answer[0] == "resync"
    assert journal.snapshot()[0][0]["assistant_text"] == "y" * (MAX_TURN_EVENTS + 10)
    assert journal.attach("unknown", 0, lambda _: None) is None


def test_finished_turns_are_retained_for_a_bounded_time() -> None:
    now = [0.0]
    journal = TurnJournal(clock=lambda: now[0])
    journal.record(_event("turn.terminal", 1, status="cancelled", assistant_text=""))
    answer = journal.attach("t1", -1, lambda _: None)
    assert answer is not None and answer[0] == "finished"
    now[0] = RETAIN_SECONDS + 1
    assert journal.snapshot() == ([], None)


def _finished(journal: TurnJournal, turn_id: str, text: str, **where: str) -> None:
    turn = info(turn_id, **where)
    journal.record(_event("turn.started", 0, turn=turn))
    journal.record(_event("turn.assistant_delta", 1, turn=turn, text=text))
    journal.record(_event("turn.terminal", 2, turn=turn, status="completed", assistant_text=text))


def test_snapshot_pages_stay_bounded_and_cover_every_turn_once() -> None:
    journal = TurnJournal()
    for i in range(60):
        _finished(journal, f"t{i}", "é" * 8000)  # 16 KB of UTF-8 each
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        items, cursor = journal.snapshot(SnapshotQuery(cursor=cursor))
        pages += 1
        assert len(msgpack.packb(items)) <= SNAPSHOT_PAGE_BYTES
        seen += [item["turn_id"] for item in items]
        if cursor is None:
            break
    assert pages > 1
    assert seen == [f"t{i}" for i in range(60)]


def test_a_turn_started_between_pages_is_seen_once_on_a_later_page() -> None:
    journal = TurnJournal()
    for i in range(40):
        _finished(journal, f"t{i}", "x" * 16000)
    first, cursor = journal.snapshot()
    assert cursor is not None
    _finished(journal, "late", "y")
    rest: list[str] = []
    while cursor is not None:
        items, cursor = journal.snapshot(SnapshotQuery(cursor=cursor))
        rest += [item["turn_id"] for item in items]
    ids = [item["turn_id"] for item in first] + rest
    assert ids == [f"t{i}" for i in range(40)] + ["late"]


def test_snapshot_filters_by_session_turns_and_project() -> None:
    journal = TurnJournal()
    _finished(journal, "a", "1", session_id="s1", project_dir="/one")
    _finished(journal, "b", "2", session_id="s2", project_dir="/one")
    _finished(journal, "c", "3", session_id="s2", project_dir="/two")

    def ids(query: SnapshotQuery) -> list[str]:
        items, cursor = journal.snapshot(query)
        assert cursor is None
        return [item["turn_id"] for item in items]

    assert ids(SnapshotQuery(session_id="s2")) == ["b", "c"]
    assert ids(SnapshotQuery(project_dir="/one")) == ["a", "b"]
    assert ids(SnapshotQuery(turn_ids=frozenset({"a", "c"}))) == ["a", "c"]
    assert ids(SnapshotQuery(session_id="s2", project_dir="/one")) == ["b"]
    item = journal.snapshot(SnapshotQuery(turn_ids=frozenset({"a"})))[0][0]
    assert item["request_id"] == "r-a" and item["idempotency_key"] is None


def test_a_cursor_not_issued_by_the_journal_is_refused() -> None:
    with pytest.raises(BadCursor):
        TurnJournal().snapshot(SnapshotQuery(cursor="nonsense"))


def test_finished_turns_beyond_the_count_bound_go_oldest_first() -> None:
    journal = TurnJournal()
    for i in range(MAX_FINISHED_TURNS + 10):
        _finished(journal, f"t{i}", "done")
    assert journal.retained() == MAX_FINISHED_TURNS
    kept = [item["turn_id"] for item in _all(journal)]
    assert kept == [f"t{i}" for i in range(10, MAX_FINISHED_TURNS + 10)]
    assert journal.attach("t9", -1, lambda _: None) is None
    assert journal.attach("t10", -1, lambda _: None) is not None


def test_finished_turns_beyond_the_byte_bound_go_oldest_first() -> None:
    journal = TurnJournal()
    # Each turn buffers ~2 MiB: 256 deltas of 4 KiB, and its terminal with the same text.
    piece = "z" * 4096
    turns = MAX_FINISHED_BYTES // (2 * 256 * len(piece)) + 3
    for i in range(turns):
        turn = info(f"t{i}")
        journal.record(_event("turn.started", 0, turn=turn))
        for seq in range(1, 257):
            journal.record(_event("turn.assistant_delta", seq, turn=turn, text=piece))
        text = piece * 256
        journal.record(_event("turn.terminal", 257, turn=turn, assistant_text=text))
        assert journal.retained_bytes() <= MAX_FINISHED_BYTES
    kept = [item["turn_id"] for item in _all(journal)]
    assert 0 < len(kept) < turns
    # The newest turns are the ones kept, whole.
    assert kept == [f"t{i}" for i in range(turns - len(kept), turns)]
    assert journal.retained_bytes() > MAX_FINISHED_BYTES - 3 * 2**20
    answer = journal.attach(kept[-1], -1, lambda _: None)
    assert answer is not None and answer[0] == "finished" and len(answer[1]) == 258


def test_a_turn_ring_counts_only_the_events_it_still_holds() -> None:
    journal = TurnJournal()
    for i in range(MAX_TURN_EVENTS * 3):
        journal.record(_event("turn.assistant_delta", i, text="w" * 100))
    journal.record(_event("turn.terminal", MAX_TURN_EVENTS * 3, assistant_text=""))
    one = len(orjson.dumps(_event("turn.assistant_delta", 1, text="w" * 100).envelope))
    assert journal.retained_bytes() < (MAX_TURN_EVENTS + 1) * (one + 16)


def _all(journal: TurnJournal) -> list[dict[str, object]]:
    items, cursor = journal.snapshot()
    while cursor is not None:
        more, cursor = journal.snapshot(SnapshotQuery(cursor=cursor))
        items += more
    return items
