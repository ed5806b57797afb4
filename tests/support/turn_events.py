"""Typed turn events for unit tests of the journal and outbound queues."""

from __future__ import annotations

from typing import Any

from magi_code.core.output import TurnEvent, TurnInfo


def info(turn_id: str = "t1", session_id: str = "s1", project_dir: str = "/p") -> TurnInfo:
    return TurnInfo(turn_id, session_id, f"r-{turn_id}", 1, project_dir)


def turn_event(
    name: str, sequence: int, *, turn: TurnInfo | None = None, **payload: Any
) -> TurnEvent:
    turn = turn or info()
    envelope = {
        "kind": "event",
        "event": name,
        "event_id": f"evt-{turn.turn_id}-{sequence}",
        "session_id": turn.session_id,
        "payload": {"turn_id": turn.turn_id, "sequence": sequence, **payload},
    }
    return TurnEvent(turn, name, sequence, envelope)
