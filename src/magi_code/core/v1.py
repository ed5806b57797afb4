"""One v1 client's record and output rules, without I/O.

Both v1 adapters drive these, the embedded stdio service (``stdio/adapter.py``) and the
daemon's ``v1_shim`` role (``daemon/v1_role.py``); each keeps only its I/O (pipes, or
frames to and from the shim) and what it tells its writer.

Records (:meth:`V1Connection.feed`): handled in order, a record over the v1 bound
answered ``record_too_large``, and each only once the answer to the one before it is
written (:meth:`Connection.answered`; a record answered later by a worker does not wait),
so after an output failure no record read behind the failed answer takes effect.

Output (:func:`next_take`): every batch already queued is taken (up to
:data:`MAX_WRITE_BATCHES`: turn and login events are queued between answers as workers
produce them) and encoded whole; the adapter writes them in order and settles each
(``Batch.written()``, which releases its request IDs) once it is written. A batch that
cannot be encoded is never written: the batches before it are, and it and every batch
after it are settled unwritten as the output closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from magi_code.dataclass import dataclass
from magi_code.protocol.envelope import OutboundError, encode_batch
from magi_code.protocol.framing import TOO_LARGE, Frame

from .coordinator import Connection, ServiceCoordinator
from .output import Batch, Output

# Batches taken from a connection's output at once.
MAX_WRITE_BATCHES: Final = 256


@dataclass(slots=True)
class Take:
    """Batches to write, in order, each with its encoded records (``data``)."""

    batches: list[Batch]
    data: list[bytes]
    # Why the output ends after these batches (the next one could not be encoded).
    failure: OutboundError | None = None


async def next_take(output: Output) -> Take | None:
    """The next batches to write; None once the output ended.

    On a batch that cannot be encoded, the output closes before this returns: the take
    holds the batches before it, and its ``failure`` says why nothing more is written.
    """
    batches = await output.get_batches(MAX_WRITE_BATCHES)
    if not batches:
        return None
    data: list[bytes] = []
    for index, batch in enumerate(batches):
        try:
            data.append(encode_batch(batch.messages))
        except OutboundError as exc:
            for unwritten in batches[index:]:
                unwritten.written()
            output.close()
            return Take(batches[:index], data, exc)
    return Take(batches, data)


class V1Connection:
    """The inbound side of one v1 client: its records, in order, each after the answer
    to the one before it was written.

    ``writer`` is the adapter's output task: once it ended (or the output closed) no
    further record is handled. ``handled`` (optional) learns each handled record's
    answer before it is waited for, or None when a worker answers it later.
    """

    def __init__(
        self,
        coordinator: ServiceCoordinator,
        conn: Connection,
        writer: asyncio.Future[Any],
        handled: Callable[[Batch | None], None] | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.conn = conn
        self._writer = writer
        self._handled = handled

    def accepting(self) -> bool:
        """Whether a record may still be handled (the output works)."""
        return not self._writer.done() and not self.conn.output.closed

    async def feed(self, frame: Frame) -> bool:
        """Handle one record (``TOO_LARGE``: one over the v1 bound, discarded) and wait
        until its answer is written; whether the next record may be handled."""
        if not self.accepting():
            return False
        batch: Batch | None
        if frame is TOO_LARGE:
            batch = self.coordinator.reject_oversize(self.conn)
        else:
            assert isinstance(frame, bytes)
            batch = await self.coordinator.handle_record(self.conn, frame)
        if not self.accepting():
            return False
        if self._handled is not None:
            self._handled(batch)
        return batch is None or await self.conn.answered(batch, self._writer)
