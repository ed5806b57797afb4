"""The per-turn replay buffer behind snapshot/attach (RFC-0002 §6)."""

from __future__ import annotations

from typing import Any

from magi_code.core.journal import MAX_TURN_EVENTS, RETAIN_SECONDS, TurnJournal


def _event(name: str, sequence: int, **payload: Any) -> dict[str, Any]:
    return {
        "kind": "event",
        "event": name,
        "session_id": "s1",
        "payload": {"turn_id": "t1", "sequence": sequence, **payload},
    }


def test_attach_returns_exactly_the_events_after_the_sequence_then_follows_live() -> None:
    journal = TurnJournal()
    journal.observe(_event("turn.started", 0))
    for i in range(1, 4):
        journal.observe(_event("turn.assistant_delta", i, text=f"x{i}"))
    live: list[dict[str, Any]] = []
    answer = journal.attach("t1", 1, live.append)
    assert answer is not None
    status, events = answer
    assert status == "attached"
    assert [e["payload"]["sequence"] for e in events] == [2, 3]
    journal.observe(_event("turn.terminal", 4, status="completed", assistant_text="x1x2x3"))
    assert [e["payload"]["sequence"] for e in live] == [4]
    snap = journal.snapshot()[0]
    assert snap["status"] == "completed" and snap["assistant_text"] == "x1x2x3"


def test_evicted_events_yield_an_explicit_resync() -> None:
    journal = TurnJournal()
    for i in range(MAX_TURN_EVENTS + 10):
        journal.observe(_event("turn.assistant_delta", i, text="y"))
    answer = journal.attach("t1", 3, lambda _: None)
    assert answer is not None and answer[0] == "resync"
    assert journal.snapshot()[0]["assistant_text"] == "y" * (MAX_TURN_EVENTS + 10)
    assert journal.attach("unknown", 0, lambda _: None) is None


def test_finished_turns_are_retained_for_a_bounded_time() -> None:
    now = [0.0]
    journal = TurnJournal(clock=lambda: now[0])
    journal.observe(_event("turn.terminal", 1, status="cancelled", assistant_text=""))
    answer = journal.attach("t1", -1, lambda _: None)
    assert answer is not None and answer[0] == "finished"
    now[0] = RETAIN_SECONDS + 1
    assert journal.snapshot() == []
