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
# What a settled key keeps of its outcome: the accepted turn's (turn_id, session_id), or
# the refusal. Up to MAX_KEYS are kept: not the payload, nor the future that carried it.
_Kept = tuple[str, str] | ErrorCode


def acceptance(turn_id: str, session_id: str) -> dict[str, Any]:
    """The payload that accepts a ``turn.start`` (and answers its repeats)."""
    return {"turn_id": turn_id, "session_id": session_id, "status": "accepted"}


@dataclass(eq=False, slots=True)
class _Entry:
    at: float
    admitting: asyncio.Future[Outcome] | None  # until the first start's outcome is known
    kept: _Kept = ErrorCode.INTERNAL_ERROR  # once it is


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
        if entry.admitting is not None:
            return await asyncio.shield(entry.admitting)
        kept = entry.kept
        return kept if isinstance(kept, ErrorCode) else acceptance(*kept)

    def begin(self, slot: Slot) -> asyncio.Future[Outcome]:
        """Claim ``slot`` for a start about to be admitted; ``settle`` the returned
        future (or ``abandon`` it)."""
        self._prune()
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._entries[slot] = _Entry(self._clock(), future)
        while len(self._entries) > MAX_KEYS:
            self._entries.popitem(last=False)
        return future

    def settle(self, slot: Slot, future: asyncio.Future[Outcome], outcome: Outcome) -> None:
        """The start ``begin`` returned ``future`` for has its outcome: tell the repeats
        that wait for it, and keep it for later ones."""
        future.set_result(outcome)
        entry = self._entries.get(slot)
        if entry is not None and entry.admitting is future:
            entry.admitting = None
            if isinstance(outcome, ErrorCode):
                entry.kept = outcome
            else:
                entry.kept = (outcome["turn_id"], outcome["session_id"])

    def abandon(self, slot: Slot, future: asyncio.Future[Outcome]) -> None:
        """The start ended without an outcome to repeat (an internal failure)."""
        entry = self._entries.get(slot)
        if entry is not None and entry.admitting is future:
            del self._entries[slot]
        if not future.done():
            future.set_result(ErrorCode.INTERNAL_ERROR)

    def _prune(self) -> None:
        now = self._clock()
        while self._entries:
            slot, entry = next(iter(self._entries.items()))
            if now - entry.at <= RETAIN_SECONDS or entry.admitting is not None:
                break
            del self._entries[slot]


def repeated(outcome: Outcome) -> dict[str, Any]:
    """The acceptance payload to answer again, or raise the remembered refusal."""
    if isinstance(outcome, ErrorCode):
        raise ServiceError(outcome)
    return dict(outcome)
