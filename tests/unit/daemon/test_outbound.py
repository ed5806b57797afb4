"""Outbound delivery rules of a persistent connection (RFC-0002 §6.2, §6.3)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.turn_events import turn_event as _event

from magi_code.core.output import Batch, TurnEvent
from magi_code.daemon.outbound import Outbound


class _Sink:
    def __init__(self, interval_ms: int = 0) -> None:
        self.written: list[dict[str, Any]] = []
        self.notices: list[dict[str, Any]] = []
        self.cut: list[str] = []
        self.buffered = 0
        self.out = Outbound(
            self.written.append,
            self.notices.append,
            lambda: self.buffered,
            limit=100,
            interval_ms=interval_ms,
            on_cut=self.cut.append,
        )


def test_a_full_queue_cuts_the_turn_once_with_the_last_sequence_sent() -> None:
    sink = _Sink()
    sink.out.deliver(_event("turn.assistant_delta", 1, text="a"))
    sink.buffered = 100
    sink.out.deliver(_event("turn.assistant_delta", 2, text="b"))
    sink.buffered = 0  # drained, but the turn stays cut until the client attaches
    sink.out.deliver(_event("turn.terminal", 3))
    response = {"kind": "response", "request_id": "r", "payload": {}}
    sink.out.own(Batch([response]), lambda _: None)
    assert [m.get("payload", {}).get("sequence") for m in sink.written] == [1, None]
    assert sink.notices == [{"t": "overloaded", "turn_id": "t1", "after_sequence": 1}]
    assert sink.cut == ["t1"]
    sink.out.follow("t1")
    sink.out.deliver(_event("turn.terminal", 3))
    assert sink.written[-1]["event"] == "turn.terminal"


async def test_coalesced_deltas_keep_order_and_the_terminal_flushes_them() -> None:
    sink = _Sink(interval_ms=10_000)
    for sequence, text in enumerate("abc", start=1):
        sink.out.deliver(_event("turn.assistant_delta", sequence, text=text))
    sink.out.deliver(_event("turn.activity", 4, activity={}))
    sink.out.deliver(_event("turn.assistant_delta", 5, text="d"))
    sink.out.deliver(_event("turn.terminal", 6))
    got = [(m["event"], m["payload"]["sequence"], m["payload"].get("text")) for m in sink.written]
    assert got == [
        ("turn.assistant_delta", 1, "a"),
        ("turn.assistant_delta", 3, "bc"),  # merged: the last merged sequence
        ("turn.activity", 4, None),
        ("turn.assistant_delta", 5, "d"),
        ("turn.terminal", 6, None),
    ]
    await asyncio.sleep(0)  # no timer left behind to send anything later
    assert len(sink.written) == 5


async def test_a_held_delta_is_sent_when_its_interval_ends() -> None:
    sink = _Sink(interval_ms=20)
    sink.out.deliver(_event("turn.assistant_delta", 1, text="a"))
    sink.out.deliver(_event("turn.assistant_delta", 2, text="b"))
    assert len(sink.written) == 1
    for _ in range(200):
        if len(sink.written) == 2:
            break
        await asyncio.sleep(0.01)
    assert sink.written[1]["payload"] == {"turn_id": "t1", "sequence": 2, "text": "b"}


def test_own_events_of_a_followed_turn_arrive_once() -> None:
    sink = _Sink()
    sink.out.follow("t1")
    seen: list[TurnEvent] = []

    def record(event: TurnEvent) -> None:
        seen.append(event)
        sink.out.deliver(event)  # what the journal does for a follower

    for event in (_event("turn.assistant_delta", 1, text="a"), _event("turn.terminal", 2)):
        sink.out.own(Batch([event.envelope], turn_events=(event,)), record)
    assert len(seen) == 2
    assert [m["payload"]["sequence"] for m in sink.written] == [1, 2]
