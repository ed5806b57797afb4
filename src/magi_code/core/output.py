"""Ordered outbound channel between the coordinator and an adapter.

The coordinator enqueues *batches*; the adapter encodes a whole batch, writes it, and then
calls ``Batch.written()`` so reservations tied to that batch are released only after the
write attempt, as the spec requires. FIFO order is the per-connection ordering guarantee:
a turn's acceptance response and ``turn.started`` share one batch, and everything the
turn emits later is enqueued after it. An adapter may take several queued batches at once
(:meth:`Output.get_batches`) and write them together, settling each after that write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from magi_code.dataclass import dataclass, field


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """What is known of a turn from its acceptance on (shared by all its events)."""

    turn_id: str
    session_id: str
    request_id: str
    conn_id: int
    project_dir: str
    idempotency_key: str | None = None
    # What a watcher's ``turn_started`` says (RFC-0002 §6.9).
    prompt: str = ""
    started_by: str = ""


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One v1 turn event, typed: the journal and outbound queues read these fields."""

    info: TurnInfo
    name: str
    sequence: int
    envelope: dict[str, Any]

    @property
    def turn_id(self) -> str:
        return self.info.turn_id

    @property
    def failure(self) -> tuple[str, str] | None:
        """``(label, remedy)`` when this is a failed turn's terminal (``turns/failures.py``)."""
        if self.name != "turn.terminal":
            return None
        payload = self.envelope["payload"]
        label = payload.get("failure")
        return None if label is None else (label, payload["remedy"])


@dataclass(slots=True)
class Batch:
    messages: list[dict[str, Any]]
    after_write: list[Callable[[], None]] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The turn events among ``messages``, in order (an adapter that keeps per-turn state
    # reads these instead of re-parsing envelopes).
    turn_events: tuple[TurnEvent, ...] = ()

    def failures(self) -> list[tuple[str, str, str]]:
        """``(turn_id, label, remedy)`` of each failed turn whose terminal is in this batch."""
        return [(e.turn_id, *f) for e in self.turn_events if (f := e.failure) is not None]

    def written(self) -> None:
        """Called once by the adapter after the write attempt (successful or not)."""
        if self.done.is_set():
            return
        self.done.set()
        for callback in self.after_write:
            callback()


class OutputClosed(Exception):
    """The adapter can no longer deliver output (EOF on stdout, connection lost)."""


class Output:
    """An unbounded FIFO of batches; producers bound themselves by awaiting ``done``."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue()
        self._closed = False
        self._ended = False  # get_batches took the end marker

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, batch: Batch) -> Batch:
        if self._closed:
            # Nothing will write it: settle it now so reservations are still released.
            batch.written()
        else:
            self._queue.put_nowait(batch)
        return batch

    async def get(self) -> Batch | None:
        """Next batch, or None once the channel is closed and drained."""
        if self._closed and self._queue.empty():
            return None
        return await self._queue.get()

    async def get_batches(self, limit: int) -> list[Batch]:
        """The next batch and up to ``limit - 1`` more already queued behind it, in order;
        an empty list once the channel is closed or finished and drained.

        Whoever takes batches owns settling them (``written()``), even those it never
        writes: :meth:`close` settles only what is still queued.
        """
        if self._ended:
            return []
        first = await self.get()
        if first is None:
            self._ended = True
            return []
        batches = [first]
        while len(batches) < limit and not self._queue.empty():
            batch = self._queue.get_nowait()
            if batch is None:
                self._ended = True
                break
            batches.append(batch)
        return batches

    def close(self) -> None:
        """Stop accepting output; queued batches are settled without being written."""
        if self._closed:
            return
        self._closed = True
        while not self._queue.empty():
            batch = self._queue.get_nowait()
            if batch is not None:
                batch.written()
        self._queue.put_nowait(None)

    def finish(self) -> None:
        """Let the writer drain what is queued, then stop."""
        self._queue.put_nowait(None)
