"""``StartKeys``: a ``turn.start`` repeated under its idempotency key gets the first
one's outcome (RFC-0002 §6.5), and a settled key keeps only that outcome."""

from __future__ import annotations

import asyncio
import gc
import weakref

from magi_code.core.idempotency import RETAIN_SECONDS, StartKeys, acceptance
from magi_code.protocol.errors import ErrorCode

SLOT = ("sess_0123456789abcdef01234567", "key-1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_repeat_gets_the_acceptance_and_no_future_is_kept() -> None:
    keys = StartKeys()
    future = keys.begin(SLOT)
    keys.settle(SLOT, future, acceptance("turn_1", "sess_a"))
    assert await future == acceptance("turn_1", "sess_a")
    gone = weakref.ref(future)
    del future
    gc.collect()
    assert gone() is None  # the key keeps the outcome, not the future that carried it
    assert await keys.repeat(SLOT) == acceptance("turn_1", "sess_a")
    assert await keys.repeat(("sess_other", "key-1")) is None  # a key names one session


async def test_a_repeat_gets_the_refusal() -> None:
    keys = StartKeys()
    keys.settle(SLOT, keys.begin(SLOT), ErrorCode.SESSION_BUSY)
    assert await keys.repeat(SLOT) is ErrorCode.SESSION_BUSY


async def test_a_repeat_during_admission_waits_for_its_outcome() -> None:
    keys = StartKeys()
    future = keys.begin(SLOT)
    waiting = asyncio.create_task(keys.repeat(SLOT))
    await asyncio.sleep(0)
    assert not waiting.done()
    keys.settle(SLOT, future, acceptance("turn_1", "sess_a"))
    assert await waiting == acceptance("turn_1", "sess_a")


async def test_an_abandoned_start_is_not_repeated_and_its_waiters_are_told() -> None:
    keys = StartKeys()
    future = keys.begin(SLOT)
    waiting = asyncio.create_task(keys.repeat(SLOT))
    await asyncio.sleep(0)
    keys.abandon(SLOT, future)
    assert await waiting is ErrorCode.INTERNAL_ERROR
    assert await keys.repeat(SLOT) is None


async def test_a_key_is_kept_for_its_retention_only() -> None:
    clock = Clock()
    keys = StartKeys(clock)
    keys.settle(SLOT, keys.begin(SLOT), acceptance("turn_1", "sess_a"))
    clock.now += RETAIN_SECONDS
    assert await keys.repeat(SLOT) is not None
    clock.now += 1
    assert await keys.repeat(SLOT) is None
