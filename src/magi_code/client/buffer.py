"""The client's bounded event buffer: backpressure for its reader task.

The reader puts each event and overload notice here; when the buffer holds its bound it
waits, so the socket is not read until ``events()`` takes one. ``close`` ends the
stream after what it holds, cleanly or with the connection's error.
"""

from __future__ import annotations

import asyncio
from collections import deque

from .errors import DaemonError
from .types import Event


class EventBuffer:
    """A bounded FIFO: ``put`` waits for room; ``close`` ends it after what it holds."""

    def __init__(self, maxsize: int) -> None:
        self._items: deque[Event] = deque()
        self._maxsize = maxsize
        self._getters: list[asyncio.Future[None]] = []
        self._room: list[asyncio.Future[None]] = []
        self._closed = False
        self._error: DaemonError | None = None
        self.putting = False

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: Event) -> None:
        """Append ``item``, first waiting (not reading the socket) while the buffer is full."""
        while not self._closed and len(self._items) >= self._maxsize:
            self.putting = True
            try:
                await _wait(self._room)
            finally:
                self.putting = False
        if self._closed:
            return
        self._items.append(item)
        _wake(self._getters)

    async def get(self, timeout: float | None = None) -> Event | None:
        """The next item; None once closed cleanly and empty; raises the close error."""
        async with asyncio.timeout(timeout):
            while not self._items and not self._closed:
                await _wait(self._getters)
        # Taken after every await: a timeout or a cancellation never loses an item.
        if self._items:
            item = self._items.popleft()
            _wake(self._room)
            return item
        if self._error is not None:
            raise DaemonError(str(self._error), self._error.code)
        return None

    def close(self, error: DaemonError | None) -> None:
        """End the stream once what it holds is taken; wake every waiter."""
        if not self._closed:
            self._closed = True
            self._error = error
            _wake(self._getters)
            _wake(self._room)


async def _wait(waiters: list[asyncio.Future[None]]) -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters.append(future)
    try:
        await future
    finally:
        if future in waiters:
            waiters.remove(future)


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for future in waiters:
        if not future.done():
            future.set_result(None)
    waiters.clear()
