"""Small waiting helpers shared by the daemon's roles."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def bounded(awaitable: Any, timeout: float) -> None:
    """Await ``awaitable`` for at most ``timeout`` seconds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(awaitable, timeout)
