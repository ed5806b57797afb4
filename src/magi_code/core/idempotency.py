"""Idempotency keys for ``turn.start``: a repeated start returns the first one's outcome.

A key names one start *for one session* (or for "a new session" when the start names
none). The first start under a key runs admission as usual; its outcome — the acceptance
payload or the refusal code — is remembered for :data:`RETAIN_SECONDS`, and a start
repeating the key (on any connection of this service) gets that outcome without starting
anything. A repeat that arrives while the first is still being admitted waits for it.
Keys also travel with the turn's durable user record, so the core can answer a repeat
after a restart from history (see ``TurnService``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError

RETAIN_SECONDS: Final = 600.0
MAX_KEYS: Final = 4096

Slot = tuple[str | None, str]  # (the start's session_id, the key)
Outcome = dict[str, Any] | ErrorCode  # the acceptance payload, or the refusal


@dataclass(eq=False, slots=True)
class _Entry:
    done: asyncio.Future[Outcome]
    at: float


class StartKeys:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: OrderedDict[Slot, _Entry] = OrderedDict()

    async def repeat(self, slot: Slot) -> Outcome | None:
        """The outcome of an earlier start under ``slot`` (waiting if it is in admission)."""
        self._prune()
        entry = self._entries.get(slot)
        if entry is None:
            return None
        return await asyncio.shield(entry.done)

    def begin(self, slot: Slot) -> asyncio.Future[Outcome]:
        """Claim ``slot`` for a start about to be admitted; settle the returned future."""
        self._prune()
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._entries[slot] = _Entry(future, self._clock())
        while len(self._entries) > MAX_KEYS:
            self._entries.popitem(last=False)
        return future

    def abandon(self, slot: Slot, future: asyncio.Future[Outcome]) -> None:
        """The start ended without an outcome to repeat (an internal failure)."""
        entry = self._entries.get(slot)
        if entry is not None and entry.done is future:
            del self._entries[slot]
        if not future.done():
            future.set_result(ErrorCode.INTERNAL_ERROR)

    def _prune(self) -> None:
        now = self._clock()
        while self._entries:
            slot, entry = next(iter(self._entries.items()))
            if now - entry.at <= RETAIN_SECONDS or not entry.done.done():
                break
            del self._entries[slot]


def repeated(outcome: Outcome) -> dict[str, Any]:
    """The acceptance payload to answer again, or raise the remembered refusal."""
    if isinstance(outcome, ErrorCode):
        raise ServiceError(outcome)
    return dict(outcome)
