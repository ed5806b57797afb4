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
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

DEFAULT_LIMIT_BYTES: Final = 1024 * 1024
MIN_LIMIT_BYTES: Final = 4096
MAX_MERGED_BYTES: Final = 32768
MAX_CUT_TURNS: Final = 1024

Message = dict[str, Any]


def turn_of(message: Message) -> str | None:
    """The turn a v1 turn event belongs to (None for responses and other events)."""
    payload = message.get("payload")
    if message.get("kind") != "event" or not isinstance(payload, dict):
        return None
    name = message.get("event")
    if not isinstance(name, str) or not name.startswith("turn."):
        return None
    turn_id = payload.get("turn_id")
    return turn_id if isinstance(turn_id, str) else None


def _sequence(message: Message) -> int:
    value = message["payload"].get("sequence", -1)
    return value if isinstance(value, int) else -1


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
        self._pending: dict[str, Message] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._last_delta: dict[str, float] = {}

    # -- entry points --------------------------------------------------------------------

    def own(self, message: Message, observe: Callable[[Message], None]) -> None:
        """A message of this connection's own output; ``observe`` feeds the journal."""
        turn_id = turn_of(message)
        followed = turn_id is not None and turn_id in self.following
        observe(message)  # may deliver it through the journal when followed
        if not followed:
            self.deliver(message)

    def deliver(self, message: Message) -> None:
        turn_id = turn_of(message)
        if turn_id is None:
            self._write(message)
            return
        if turn_id in self.cut:
            return
        name = message.get("event")
        if name == "turn.assistant_delta" and self._interval > 0:
            self._coalesce(turn_id, message)
            return
        self._flush(turn_id)
        if turn_id in self.cut:  # flushing the pending delta met a full queue
            return
        self._live(turn_id, message)
        if name == "turn.terminal":
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

    # -- internals -----------------------------------------------------------------------

    def _live(self, turn_id: str, message: Message) -> None:
        if self._buffered() >= self._limit:
            self._cut(turn_id)
            return
        self._write(message)
        self._sent[turn_id] = _sequence(message)

    def _cut(self, turn_id: str) -> None:
        after = self._sent.get(turn_id, -1)
        self._end(turn_id)
        self.cut[turn_id] = after
        while len(self.cut) > MAX_CUT_TURNS:
            self.cut.popitem(last=False)
        self._on_cut(turn_id)
        self._notify({"t": "overloaded", "turn_id": turn_id, "after_sequence": after})

    def _end(self, turn_id: str) -> None:
        timer = self._timers.pop(turn_id, None)
        if timer is not None:
            timer.cancel()
        self._pending.pop(turn_id, None)
        self._sent.pop(turn_id, None)
        self._last_delta.pop(turn_id, None)
        self.following.discard(turn_id)

    def _coalesce(self, turn_id: str, message: Message) -> None:
        pending = self._pending.get(turn_id)
        if pending is not None:
            text = pending["payload"]["text"] + message["payload"]["text"]
            if len(text.encode()) <= MAX_MERGED_BYTES:
                merged = {**message, "payload": {**message["payload"], "text": text}}
                self._pending[turn_id] = merged
                return
            self._flush(turn_id)  # the merged delta would be too big: send what we have
            if turn_id in self.cut:
                return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._last_delta.get(turn_id, -math.inf) + self._interval
        if now >= due:
            self._last_delta[turn_id] = now
            self._live(turn_id, message)
            return
        self._pending[turn_id] = message
        self._timers[turn_id] = loop.call_at(due, self._flush, turn_id)

    def _flush(self, turn_id: str) -> None:
        timer = self._timers.pop(turn_id, None)
        if timer is not None:
            timer.cancel()
        pending = self._pending.pop(turn_id, None)
        if pending is not None:
            self._last_delta[turn_id] = asyncio.get_running_loop().time()
            self._live(turn_id, pending)
