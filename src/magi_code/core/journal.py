"""Per-turn replay buffers for turns accepted over persistent v2 connections.

Every typed turn event a persistent connection's output carries is recorded here (whether
or not its client is still connected), so a reattaching client can snapshot a turn and
get exactly the events after the last sequence it saw, or an explicit resync answer when
they were evicted. Bounds (RFC-0002 §6): :data:`MAX_TURN_EVENTS` events per turn,
finished turns kept :data:`RETAIN_SECONDS`, at most :data:`MAX_FINISHED_TURNS` of them
and at most :data:`MAX_FINISHED_BYTES` of their events (counted as encoded, the oldest
finished turns go first). A finished turn the journal no longer holds is still read from
its session's durable history (``session.replay``, ``attach`` with ``session_id``).

Snapshots page: each turn gets an ordinal when first recorded, and a page's cursor is the
last ordinal it covered, so a client following cursors sees every matching turn once.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final

import msgpack
import orjson

from magi_code.dataclass import dataclass, field

from .output import TurnEvent, TurnInfo

MAX_TURN_EVENTS: Final = 512
RETAIN_SECONDS: Final = 600.0
MAX_FINISHED_TURNS: Final = 256
# 256 turns of a few hundred events each stay well under it; four turns at the per-turn
# ring's worst case (512 events of up to ~8 KiB each) reach it.
MAX_FINISHED_BYTES: Final = 16 * 1024 * 1024
MAX_RUNNING_TURNS: Final = 1024
# What one snapshot page may carry: well inside the 1 MiB frame, whatever the items.
SNAPSHOT_PAGE_BYTES: Final = 512 * 1024
_CURSOR_PREFIX: Final = "j1."

Deliver = Callable[[TurnEvent], None]


@dataclass(frozen=True, slots=True)
class SnapshotQuery:
    session_id: str | None = None
    turn_ids: frozenset[str] | None = None
    project_dir: str | None = None
    cursor: str | None = None


class BadCursor(ValueError):
    """The cursor was not issued by this journal."""


@dataclass(eq=False, slots=True)
class TurnLog:
    info: TurnInfo
    ordinal: int
    events: deque[TurnEvent] = field(default_factory=lambda: deque(maxlen=MAX_TURN_EVENTS))
    sizes: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_TURN_EVENTS))
    size: int = 0  # the buffered events' encoded bytes
    text: list[str] = field(default_factory=list)
    last_sequence: int = -1
    evicted_upto: int = -1  # highest sequence no longer buffered
    terminal: dict[str, Any] | None = None
    finished_at: float | None = None
    followers: list[Deliver] = field(default_factory=list)

    def append(self, event: TurnEvent) -> None:
        if len(self.events) == self.events.maxlen:
            self.evicted_upto = self.events[0].sequence
            self.size -= self.sizes[0]
        size = len(orjson.dumps(event.envelope))
        self.events.append(event)
        self.sizes.append(size)
        self.size += size
        self.last_sequence = max(self.last_sequence, event.sequence)

    def after(self, sequence: int) -> list[TurnEvent]:
        return [e for e in self.events if e.sequence > sequence]

    def matches(self, query: SnapshotQuery) -> bool:
        info = self.info
        return (
            (query.session_id is None or info.session_id == query.session_id)
            and (query.turn_ids is None or info.turn_id in query.turn_ids)
            and (query.project_dir is None or info.project_dir == query.project_dir)
        )

    def snapshot(self) -> dict[str, Any]:
        info, terminal = self.info, self.terminal
        status: object = "running"
        text: object = "".join(self.text)
        rest: dict[str, Any] | None = None
        if terminal is not None:
            # The text once, at the top: the terminal item carries everything else.
            status, text = terminal.get("status"), terminal.get("assistant_text", "")
            rest = {k: v for k, v in terminal.items() if k != "assistant_text"}
        return {
            "turn_id": info.turn_id,
            "session_id": info.session_id,
            "project_dir": info.project_dir,
            "request_id": info.request_id,
            "idempotency_key": info.idempotency_key,
            "status": status,
            "assistant_text": text,
            "sequence": self.last_sequence,
            "terminal": rest,
            "failure": self.failure,
        }

    @property
    def failure(self) -> str | None:
        """A failed turn's label, as its terminal says (None until then, and otherwise)."""
        return None if self.terminal is None else self.terminal.get("failure")


class TurnJournal:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._turns: OrderedDict[str, TurnLog] = OrderedDict()
        self._ordinals = 0

    def retained(self) -> int:
        """Finished turns still kept for snapshot and attach."""
        return sum(1 for log in self._turns.values() if log.finished_at is not None)

    def retained_bytes(self) -> int:
        """The encoded size of the finished turns' kept events."""
        return sum(log.size for log in self._turns.values() if log.finished_at is not None)

    def record(self, event: TurnEvent) -> None:
        """Record one turn event and hand it to the turn's followers."""
        log = self._turns.get(event.turn_id)
        if log is None:
            self._prune()
            self._ordinals += 1
            log = TurnLog(event.info, self._ordinals)
            self._turns[event.turn_id] = log
        log.append(event)
        payload = event.envelope["payload"]
        if event.name == "turn.assistant_delta":
            log.text.append(payload["text"])
        elif event.name == "turn.terminal":
            log.terminal = payload
            log.finished_at = self._clock()
            # The terminal carries the authoritative text: drop the per-delta pieces.
            log.text.clear()
            self._prune()
        for deliver in list(log.followers):
            deliver(event)
        if log.terminal is not None:
            log.followers.clear()

    def snapshot(
        self, query: SnapshotQuery = SnapshotQuery(), budget: int = SNAPSHOT_PAGE_BYTES
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of matching turns, oldest first, and the cursor of the next page.

        A page holds at least one item and at most ``budget`` bytes of encoded items.
        """
        self._prune()
        after = _parse_cursor(query.cursor)
        items: list[dict[str, Any]] = []
        used = 0
        last = after
        for log in self._turns.values():
            if log.ordinal <= after or not log.matches(query):
                continue
            item = log.snapshot()
            size = len(msgpack.packb(item, use_bin_type=True))
            if items and used + size > budget:
                return items, f"{_CURSOR_PREFIX}{last}"
            items.append(item)
            used += size
            last = log.ordinal
        return items, None

    def attach(
        self, turn_id: str, after: int, deliver: Deliver
    ) -> tuple[str, list[TurnEvent]] | None:
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

    def running(self, session_id: str) -> list[TurnLog]:
        """The session's turns that have not ended, oldest first."""
        return [
            log
            for log in self._turns.values()
            if log.terminal is None and log.info.session_id == session_id
        ]

    def ended(self, turn_id: str) -> TurnInfo | None:
        """A retained finished turn's info, else None (running or unknown)."""
        log = self._turns.get(turn_id)
        return None if log is None or log.terminal is None else log.info

    def failure(self, turn_id: str) -> str | None:
        """The failure label of a journaled failed turn, else None."""
        log = self._turns.get(turn_id)
        return None if log is None else log.failure

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
        # Oldest first (insertion order): beyond either cap the earliest finished turns go.
        kept = len(finished)
        kept_bytes = sum(self._turns[turn_id].size for turn_id in finished)
        for turn_id in finished:
            if kept <= MAX_FINISHED_TURNS and kept_bytes <= MAX_FINISHED_BYTES:
                break
            expired.append(turn_id)
            kept -= 1
            kept_bytes -= self._turns[turn_id].size
        for turn_id in expired:
            del self._turns[turn_id]
        while len(self._turns) > MAX_FINISHED_TURNS + MAX_RUNNING_TURNS:
            self._turns.popitem(last=False)


def _parse_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.startswith(_CURSOR_PREFIX) or not cursor[len(_CURSOR_PREFIX) :].isdigit():
        raise BadCursor(cursor)
    return int(cursor[len(_CURSOR_PREFIX) :])
