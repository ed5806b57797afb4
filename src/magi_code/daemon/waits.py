"""Small waiting helpers shared by the daemon's roles."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def bounded(awaitable: Any, timeout: float) -> None:
    """Await ``awaitable`` for at most ``timeout`` seconds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(awaitable, timeout)


async def wait_either(waiter: Any, task: asyncio.Task[Any]) -> None:
    """Until ``waiter`` completes or ``task`` ends."""
    future = asyncio.ensure_future(waiter)
    try:
        await asyncio.wait({future, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        future.cancel()
