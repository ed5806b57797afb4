"""Streamed assistant text made durable in bounded increments while it streams.

Theory of operation: the agent hands every accepted delta of one provider response to
``StreamedText.add`` (synchronous, never blocks the delta stream). The text not yet
written is appended as one ``assistant`` record, in a task of its own (the append itself
runs off the event loop, as every session append does), as soon as either

- at least ``INCREMENT_BYTES`` (4 KiB) of UTF-8 are unsaved, or
- the oldest unsaved text has waited ``INCREMENT_SECONDS`` (250 ms): a timer fires even
  when the stream has stalled.

At most one append is in flight; text arriving meanwhile waits for the next increment.
So a response costs at most one append (one fsync) per 4 KiB and per 250 ms, and text
streamed more than 250 ms (plus one append) ago survives a crash of the process.

``settle()`` ends the increments: it waits for the append in flight and writes what is
left as one last record; once it succeeds, nothing added later is written. The agent
settles at the end of each response; the turn settles again when it ends (cancelled or
failed mid-stream), which is then a no-op or writes the rest. Appends are shielded from
cancellation, so a cancelled turn never leaves a record half-acknowledged and then
written twice.

The records of one response are consecutive ``assistant`` records of the turn; their
texts concatenated are the response (``turns.context`` joins them again for the provider).
A background append that fails stops the increments and keeps its text unsaved: the next
``settle()`` tries again and raises what the store raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final

INCREMENT_BYTES: Final = 4096
INCREMENT_SECONDS: Final = 0.25

# Writes one increment durably: the session append of an ``assistant`` record, with
# ``continued`` true while the response goes on in a later record (replay keeps the
# increments one message).
Append = Callable[[str, bool], Awaitable[object]]


class StreamedText:
    """The text of one provider response and how much of it is durable."""

    def __init__(
        self,
        append: Append | None,
        *,
        incremental: bool = True,
        max_bytes: int = INCREMENT_BYTES,
        interval: float = INCREMENT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._append = append
        self._incremental = incremental and append is not None
        self._max_bytes = max_bytes
        self._interval = interval
        self._clock = clock
        self._parts: list[str] = []
        self._saved = 0  # parts written or in flight
        self._unsaved_bytes = 0
        self._oldest: float | None = None  # when the oldest unsaved text arrived
        self._writing: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._failed = False
        self._settled = False
        self._open = False  # the last durable record said ``continued``
        self.appends = 0

    @property
    def text(self) -> str:
        """Everything added so far."""
        return "".join(self._parts)

    @property
    def unsaved(self) -> str:
        """Text neither durable nor being written."""
        return "".join(self._parts[self._saved :])

    def add(self, delta: str) -> None:
        if not delta:
            return
        self._parts.append(delta)
        self._unsaved_bytes += len(delta.encode())
        if self._oldest is None:
            self._oldest = self._clock()
        self._consider()

    async def settle(self) -> None:
        """Stop the increments and make everything added durable (raises as the store)."""
        self._settled = True
        self._cancel_timer()
        await self._wait_writing()
        if self._append is not None and (self._saved < len(self._parts) or self._open):
            # The last increment runs in its own task too: cancelling the caller never
            # interrupts an append whose text would then be written again. With nothing
            # left it is empty: it only ends the message the increments left open.
            self._start_write(background=False)
            await self._wait_writing(reraise=True)
        # Settled: the writer is not needed again. It is the agent's method, and the agent
        # holds this text: kept, that cycle would keep the whole turn (its conversation,
        # its tools) until the cycle collector's next full pass instead of its end.
        self._append = None

    # -- increments ----------------------------------------------------------------------

    def _consider(self) -> None:
        if not self._incremental or self._settled or self._failed or self._writing is not None:
            return
        if self._saved == len(self._parts) or self._oldest is None:
            return
        due = self._oldest + self._interval
        if self._unsaved_bytes >= self._max_bytes or self._clock() >= due:
            self._cancel_timer()
            self._start_write(background=True)
        elif self._timer is None:
            delay = max(0.0, due - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._consider()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _start_write(self, *, background: bool) -> None:
        assert self._append is not None and self._writing is None
        start, end = self._saved, len(self._parts)
        text = "".join(self._parts[start:end])
        self._saved = end
        self._unsaved_bytes = 0
        self._oldest = None
        self._writing = asyncio.create_task(self._write(self._append, text, start, background))

    async def _write(self, append: Append, text: str, start: int, background: bool) -> None:
        try:
            await append(text, background)
        except BaseException:
            # Not durable: the text is unsaved again, increments stop, settle() retries.
            self._saved = start
            self._unsaved_bytes = len(self.unsaved.encode())
            self._failed = True
            if not background:
                raise
            return  # a background increment's failure is settle()'s to report
        finally:
            self._writing = None
        self.appends += 1
        self._open = background
        if background:
            self._consider()  # text that arrived meanwhile may be due already

    async def _wait_writing(self, *, reraise: bool = False) -> None:
        writing = self._writing
        if writing is None:
            return
        if reraise:
            await asyncio.shield(writing)
        else:
            await asyncio.wait({writing})  # never cancels it; a failure is retried
