"""Group commit of one session history: records queued while an fsync runs are written
and fsynced together, and each is reported durable only after the fsync that covers it.

Theory of operation
-------------------
A ``CommitQueue`` belongs to one writer lease (its history and append-lock fds).
``submit`` assigns the next ``seq``, encodes the line and queues it; it does no I/O.
The first submit while no flush runs starts one on the store's commit executor. A flush
takes everything queued, takes the append lock exclusively, writes the batch with one
``write()`` on the ``O_APPEND`` fd (looping only on short writes), fsyncs, releases the
lock, and only then moves ``durable`` past the batch and wakes its waiters: threads
blocked in ``wait`` and asyncio futures (resolved through their own loop). Records
submitted meanwhile form the next batch. One flush per queue runs at a time and batches
are taken in submit order, so the file holds a session's records in ``seq`` order.

A failed batch (the append lock still contended after ``lock_wait``: ``SESSION_BUSY``;
a failed write or fsync: ``SESSION_UNAVAILABLE``, after truncating back to the size
before the batch when possible) fails its own records with that code and the records
queued behind it with ``SESSION_UNAVAILABLE``, and the queue accepts nothing more: a
record queued behind another may depend on it (a tool result on its call, a terminal on
its turn), so nothing is ever written after a hole. Records already durable stay so.

Thread-safe: ``submit`` and the waits may be called from any thread or event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.fileio import holding, write_all

# After a batch is durable, before its waiters are woken (titles); must never raise.
Hook = Callable[[], None]

_PENDING: Final = object()
_Outcome = ErrorCode | None | object  # None: durable; a code: failed; _PENDING


@dataclass(slots=True)
class _Entry:
    seq: int
    line: bytes
    hook: Hook | None


@dataclass(slots=True)
class _AsyncWaiter:
    seq: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _settle(future: asyncio.Future[None], code: ErrorCode | None) -> None:
    if future.done():
        return  # its waiter was cancelled; the record is written anyway
    if code is None:
        future.set_result(None)
    else:
        future.set_exception(ServiceError(code))


class CommitQueue:
    """Queued, group-committed appends to one history file."""

    def __init__(
        self,
        history_fd: int,
        lock_fd: int,
        last_seq: int,
        executor: Executor,
        lock_wait: float,
    ) -> None:
        self._history_fd = history_fd
        self._lock_fd = lock_fd
        self._executor = executor
        self._lock_wait = lock_wait
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Entry] = []
        self._submitted = last_seq
        self._durable = last_seq
        self._pending_bytes = 0  # submitted, neither durable nor failed yet
        self._flushing = False
        self._closed = False
        self._error: ErrorCode | None = None  # set once a batch failed
        self._failed_through = last_seq  # the last seq of the batch that failed
        self._waiters: list[_AsyncWaiter] = []
        self.batches = 0  # flushes that wrote (or tried to write) a batch

    # The properties read one value without the lock: the read is atomic, and the value may
    # change as soon as the lock is released anyway. The event loop reads them for every
    # record and event.

    @property
    def submitted(self) -> int:
        """The seq of the last record submitted (or the last one in the file before)."""
        return self._submitted

    @property
    def durable(self) -> int:
        """Every record up to this seq is durable."""
        return self._durable

    @property
    def queued(self) -> int:
        """Records submitted that no flush has taken yet."""
        return len(self._queue)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def failed(self) -> bool:
        return self._error is not None

    def submit(self, encode: Callable[[int], bytes], hook: Hook | None = None) -> int:
        """Queue the line ``encode(seq)`` under the next seq and return that seq.

        ``encode`` runs under the queue's lock; if it raises, no seq is used.

        Raises:
            ServiceError: ``SESSION_UNAVAILABLE`` once the queue is closed or a batch
                failed; whatever ``encode`` raises.
        """
        with self._cond:
            if self._closed or self._error is not None:
                raise ServiceError(ErrorCode.SESSION_UNAVAILABLE)
            seq = self._submitted + 1
            line = encode(seq)
            self._queue.append(_Entry(seq, line, hook))
            self._submitted = seq
            self._pending_bytes += len(line)
            start = not self._flushing
            self._flushing = True
        if start:
            try:
                self._executor.submit(self._flush)
            except RuntimeError:  # the executor is shut down (interpreter exit)
                with self._cond:
                    self._fail(ErrorCode.SESSION_UNAVAILABLE, self._submitted)
                    self._flushing = False
                    waiters = self._resolved_waiters()
                    self._cond.notify_all()
                self._wake(waiters)
        return seq

    def wait(self, seq: int) -> None:
        """Block until record ``seq`` is durable.

        Raises:
            ServiceError: the code its batch failed with (see the module docstring).
        """
        with self._cond:
            while (outcome := self._outcome(seq)) is _PENDING:
                self._cond.wait()
        if isinstance(outcome, ErrorCode):
            raise ServiceError(outcome)

    async def wait_async(self, seq: int) -> None:
        """``wait`` for an event loop: returns at once when ``seq`` is already durable."""
        future: asyncio.Future[None] | None = None
        with self._cond:
            outcome = self._outcome(seq)
            if outcome is _PENDING:
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiters.append(_AsyncWaiter(seq, loop, future))
        if future is not None:
            await future
        elif isinstance(outcome, ErrorCode):
            raise ServiceError(outcome)

    def close(self) -> None:
        """Accept nothing more and wait until the flush in progress (if any) ended."""
        with self._cond:
            self._closed = True
            while self._flushing:
                self._cond.wait()

    # -- under the lock ------------------------------------------------------------------

    def _outcome(self, seq: int) -> _Outcome:
        if seq <= self._durable:
            return None
        if self._error is not None:
            return self._error if seq <= self._failed_through else ErrorCode.SESSION_UNAVAILABLE
        if seq > self._submitted:
            raise ValueError("no such record was submitted")
        return _PENDING

    def _fail(self, code: ErrorCode, through: int) -> None:
        self._error = code
        self._failed_through = through
        self._queue = []
        self._pending_bytes = 0

    def _resolved_waiters(self) -> list[tuple[_AsyncWaiter, ErrorCode | None]]:
        done: list[tuple[_AsyncWaiter, ErrorCode | None]] = []
        waiting: list[_AsyncWaiter] = []
        for waiter in self._waiters:
            outcome = self._outcome(waiter.seq)
            if outcome is _PENDING:
                waiting.append(waiter)
            else:
                done.append((waiter, outcome if isinstance(outcome, ErrorCode) else None))
        self._waiters = waiting
        return done

    # -- the flush (one at a time, on the executor) ----------------------------------------

    @staticmethod
    def _wake(resolved: list[tuple[_AsyncWaiter, ErrorCode | None]]) -> None:
        for waiter, code in resolved:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                waiter.loop.call_soon_threadsafe(_settle, waiter.future, code)

    def _flush(self) -> None:
        while True:
            with self._cond:
                batch = self._queue
                if not batch or self._error is not None:
                    self._flushing = False
                    self._cond.notify_all()
                    return
                self._queue = []
            size = sum(len(entry.line) for entry in batch)
            code = self._write(b"".join(entry.line for entry in batch))
            if code is None:
                for entry in batch:
                    if entry.hook is not None:
                        with contextlib.suppress(Exception):  # best effort by contract
                            entry.hook()
            with self._cond:
                self.batches += 1
                if code is None:
                    self._durable = batch[-1].seq
                    self._pending_bytes -= size
                else:
                    self._fail(code, batch[-1].seq)
                waiters = self._resolved_waiters()
                self._cond.notify_all()
            self._wake(waiters)

    def _write(self, data: bytes) -> ErrorCode | None:
        try:
            with holding(self._lock_fd, fcntl.LOCK_EX, self._lock_wait):
                try:
                    size = os.fstat(self._history_fd).st_size
                except OSError:
                    return ErrorCode.SESSION_UNAVAILABLE
                try:
                    write_all(self._history_fd, data)
                    os.fsync(self._history_fd)
                except OSError:
                    # The file state is unknown: drop any part of the batch if possible
                    # (and make that durable) before the lock is released.
                    with contextlib.suppress(OSError):
                        os.ftruncate(self._history_fd, size)
                        os.fsync(self._history_fd)
                    return ErrorCode.SESSION_UNAVAILABLE
        except ServiceError as exc:
            return exc.code
        except OSError:  # the lock itself failed
            return ErrorCode.SESSION_UNAVAILABLE
        return None
