"""What one persistent v2 connection is sent: live turn events, coalesced or cut off.

Theory of operation (RFC-0002 §6.2, §6.3):

- Turns never wait for a client. The transport's write buffer is the connection's
  outbound queue, bounded by ``limit`` bytes. Responses and non-turn events are always
  written (they are bounded by the client's own requests in flight).
- A turn event that meets a full queue *cuts* the connection from that turn's live
  stream: nothing more of that turn is sent, and one ``overloaded`` frame names the
  turn and the last sequence this connection was sent. The client resyncs with
  ``attach`` from that sequence (the turn's replay buffer, or ``resync`` + snapshot +
  ``session.replay``). Nothing is dropped silently; the turn keeps running.
- With ``interval`` > 0 consecutive assistant deltas of one turn are merged until the
  interval since the previous delta sent has passed; the merged delta carries the last
  merged delta's envelope and sequence, so the client sees sequence gaps. Any other
  event of the turn (activity, terminal) first flushes the pending delta, so order is
  kept and the terminal is never delayed.
- Turns the connection follows through the journal (``attach``) are delivered by the
  journal only, so a client attached to its own turn gets each event once.
- Turn events arrive typed (:class:`~magi_code.core.output.TurnEvent`): nothing here
  parses an envelope to learn its turn or sequence.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from magi_code.core.output import Batch, TurnEvent
from magi_code.protocol import v2

DEFAULT_LIMIT_BYTES: Final = 1024 * 1024
MIN_LIMIT_BYTES: Final = 4096
# A client that neither reads nor acknowledges its output for this long is dropped.
CLIENT_TIMEOUT_SECONDS: Final = 60.0
MAX_MERGED_BYTES: Final = 32768
MAX_CUT_TURNS: Final = 1024

Message = dict[str, Any]


def _closed(_: Any) -> None:
    pass


def _nothing_buffered() -> int:
    return 0


class Outbound:
    def __init__(
        self,
        write: Callable[[Message], None],
        notify: Callable[[dict[str, Any]], None],
        buffered: Callable[[], int],
        *,
        limit: int,
        interval_ms: int,
        on_cut: Callable[[str], None],
    ) -> None:
        self._write = write
        self._notify = notify
        self._buffered = buffered
        self._limit = limit
        self._interval = interval_ms / 1000
        self._on_cut = on_cut
        self.following: set[str] = set()
        self.cut: OrderedDict[str, int] = OrderedDict()
        self._sent: dict[str, int] = {}  # last sequence sent per live turn
        self._pending: dict[str, TurnEvent] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._last_delta: dict[str, float] = {}

    # -- entry points --------------------------------------------------------------------

    def own(self, batch: Batch, record: Callable[[TurnEvent], None]) -> None:
        """A batch of this connection's own output; ``record`` feeds the journal."""
        events = {id(event.envelope): event for event in batch.turn_events}
        for message in batch.messages:
            event = events.get(id(message))
            if event is None:
                self._write(message)
                continue
            followed = event.turn_id in self.following
            record(event)  # delivers it through the journal when followed
            if not followed:
                self.deliver(event)

    def deliver(self, event: TurnEvent) -> None:
        turn_id = event.turn_id
        if turn_id in self.cut:
            return
        if event.name == "turn.assistant_delta" and self._interval > 0:
            self._coalesce(turn_id, event)
            return
        self._flush(turn_id)
        if turn_id in self.cut:  # flushing the pending delta met a full queue
            return
        self._live(turn_id, event)
        if event.name == "turn.terminal":
            self._end(turn_id)

    def follow(self, turn_id: str) -> None:
        """The client attached to this turn: the journal delivers it from now on."""
        self.cut.pop(turn_id, None)
        self.following.add(turn_id)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._pending.clear()
        # Nothing is written after this. The writers are the role's methods: kept, they
        # would hold the role, which holds this, in a cycle only the cycle collector frees.
        self._write = self._notify = self._on_cut = _closed
        self._buffered = _nothing_buffered

    # -- internals -----------------------------------------------------------------------

    def _live(self, turn_id: str, event: TurnEvent) -> None:
        if self._buffered() >= self._limit:
            self._cut(turn_id)
            return
        self._write(event.envelope)
        self._sent[turn_id] = event.sequence

    def _cut(self, turn_id: str) -> None:
        after = self._sent.get(turn_id, -1)
        self._end(turn_id)
        self.cut[turn_id] = after
        while len(self.cut) > MAX_CUT_TURNS:
            self.cut.popitem(last=False)
        self._on_cut(turn_id)
        self._notify(v2.overloaded(turn_id, after))

    def _end(self, turn_id: str) -> None:
        timer = self._timers.pop(turn_id, None)
        if timer is not None:
            timer.cancel()
        self._pending.pop(turn_id, None)
        self._sent.pop(turn_id, None)
        self._last_delta.pop(turn_id, None)
        self.following.discard(turn_id)

    def _coalesce(self, turn_id: str, event: TurnEvent) -> None:
        pending = self._pending.get(turn_id)
        if pending is not None:
            text = pending.envelope["payload"]["text"] + event.envelope["payload"]["text"]
            if len(text.encode()) <= MAX_MERGED_BYTES:
                envelope = event.envelope
                merged = {**envelope, "payload": {**envelope["payload"], "text": text}}
                self._pending[turn_id] = replace(event, envelope=merged)
                return
            self._flush(turn_id)  # the merged delta would be too big: send what we have
            if turn_id in self.cut:
                return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._last_delta.get(turn_id, -math.inf) + self._interval
        if now >= due:
            self._last_delta[turn_id] = now
            self._live(turn_id, event)
            return
        self._pending[turn_id] = event
        self._timers[turn_id] = loop.call_at(due, self._flush, turn_id)

    def _flush(self, turn_id: str) -> None:
        timer = self._timers.pop(turn_id, None)
        if timer is not None:
            timer.cancel()
        pending = self._pending.pop(turn_id, None)
        if pending is not None:
            self._last_delta[turn_id] = asyncio.get_running_loop().time()
            self._live(turn_id, pending)
