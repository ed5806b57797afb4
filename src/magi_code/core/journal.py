"""Per-turn replay buffers for turns accepted over persistent v2 connections.

The daemon's persistent writer shows every outbound v1 event to :meth:`TurnJournal.observe`
(whether or not its client is still connected), so a reattaching client can snapshot a
turn and get exactly the events after the last sequence it saw, or an explicit resync
answer when they were evicted. Bounds (RFC-0002 §6): :data:`MAX_TURN_EVENTS` events per
turn, finished turns kept :data:`RETAIN_SECONDS` and at most :data:`MAX_FINISHED_TURNS`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

MAX_TURN_EVENTS: Final = 512
RETAIN_SECONDS: Final = 600.0
MAX_FINISHED_TURNS: Final = 256
MAX_RUNNING_TURNS: Final = 1024

Deliver = Callable[[dict[str, Any]], None]


@dataclass(eq=False, slots=True)
class TurnLog:
    turn_id: str
    session_id: str | None
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_TURN_EVENTS))
    text: list[str] = field(default_factory=list)
    last_sequence: int = -1
    evicted_upto: int = -1  # highest sequence no longer buffered
    terminal: dict[str, Any] | None = None
    finished_at: float | None = None
    followers: list[Deliver] = field(default_factory=list)

    def append(self, message: dict[str, Any], sequence: int) -> None:
        if len(self.events) == self.events.maxlen:
            self.evicted_upto = _sequence(self.events[0])
        self.events.append(message)
        self.last_sequence = max(self.last_sequence, sequence)

    def after(self, sequence: int) -> list[dict[str, Any]]:
        return [m for m in self.events if _sequence(m) > sequence]

    def snapshot(self) -> dict[str, Any]:
        terminal = self.terminal
        return {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "status": "running" if terminal is None else terminal.get("status"),
            "assistant_text": (
                "".join(self.text) if terminal is None else terminal.get("assistant_text")
            ),
            "sequence": self.last_sequence,
            "terminal": terminal,
        }


def _sequence(message: dict[str, Any]) -> int:
    value = message.get("payload", {}).get("sequence", -1)
    return value if isinstance(value, int) else -1


class TurnJournal:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._turns: OrderedDict[str, TurnLog] = OrderedDict()

    def observe(self, message: dict[str, Any]) -> None:
        """Record one outbound v1 message; non-turn messages are ignored."""
        name = message.get("event")
        payload = message.get("payload")
        if message.get("kind") != "event" or not isinstance(name, str):
            return
        if not name.startswith("turn.") or not isinstance(payload, dict):
            return
        turn_id = payload.get("turn_id")
        if not isinstance(turn_id, str):
            return
        log = self._turns.get(turn_id)
        if log is None:
            self._prune()
            log = TurnLog(turn_id, message.get("session_id"))
            self._turns[turn_id] = log
        log.append(message, _sequence(message))
        if name == "turn.assistant_delta" and isinstance(payload.get("text"), str):
            log.text.append(payload["text"])
        elif name == "turn.terminal":
            log.terminal = payload
            log.finished_at = self._clock()
            # The terminal carries the authoritative text: drop the per-delta pieces.
            log.text.clear()
        for deliver in list(log.followers):
            deliver(message)
        if log.terminal is not None:
            log.followers.clear()

    def snapshot(self) -> list[dict[str, Any]]:
        self._prune()
        return [log.snapshot() for log in self._turns.values()]

    def attach(
        self, turn_id: str, after: int, deliver: Deliver
    ) -> tuple[str, list[dict[str, Any]]] | None:
        """``(status, events)`` for a follower, or None for an unknown turn.

        Status ``resync`` when events after ``after`` were evicted (the follower is still
        attached to what comes next), ``finished`` when the turn already ended.
        """
        self._prune()
        log = self._turns.get(turn_id)
        if log is None:
            return None
        events = log.after(after)
        if log.terminal is not None:
            return ("resync" if after < log.evicted_upto else "finished"), events
        log.followers.append(deliver)
        return ("resync" if after < log.evicted_upto else "attached"), events

    def unfollow(self, turn_id: str, deliver: Deliver) -> None:
        log = self._turns.get(turn_id)
        if log is not None and deliver in log.followers:
            log.followers.remove(deliver)

    def sequence(self, turn_id: str) -> int:
        """The last sequence recorded for a turn (-1 when none or unknown)."""
        log = self._turns.get(turn_id)
        return -1 if log is None else log.last_sequence

    def forget(self, deliver: Deliver) -> None:
        for log in self._turns.values():
            if deliver in log.followers:
                log.followers.remove(deliver)

    @property
    def running(self) -> int:
        return sum(1 for log in self._turns.values() if log.terminal is None)

    def _prune(self) -> None:
        now = self._clock()
        finished = [
            turn_id
            for turn_id, log in self._turns.items()
            if log.finished_at is not None and now - log.finished_at <= RETAIN_SECONDS
        ]
        expired = [
            turn_id
            for turn_id, log in self._turns.items()
            if log.finished_at is not None and now - log.finished_at > RETAIN_SECONDS
        ]
        # Oldest first (insertion order): beyond the cap the earliest finished turns go.
        expired += finished[: max(0, len(finished) - MAX_FINISHED_TURNS)]
        for turn_id in expired:
            del self._turns[turn_id]
        while len(self._turns) > MAX_FINISHED_TURNS + MAX_RUNNING_TURNS:
            self._turns.popitem(last=False)
