"""The ``v1_shim`` role (RFC-0002 §5): one v1 stdio service, bridged record by record.

The connection *is* a v1 service: its records run through the shared coordinator, and
its output batches go out one at a time, each released only after the shim wrote and
acknowledged it, which reproduces the embedded adapter's ordering exactly. Its end (EOF,
shim death, owner drop) cancels and drains its turns and login; their terminal events
still reach the shim while it is connected. A shim that leaves a batch unacknowledged for
the server's ``client_timeout`` (its frontend stopped reading stdout) is an output
failure: its work is cancelled and drained, so it cannot hold turns or workers that other
frontends need.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from magi_code.core.coordinator import Connection
from magi_code.core.output import Batch
from magi_code.protocol import v2
from magi_code.protocol.envelope import OutboundError, encode_batch
from magi_code.protocol.v2 import MESSAGES, Code

from .waits import bounded, wait_either

if TYPE_CHECKING:
    from .connection import PeerConnection

log = logging.getLogger("magi_code.daemon")


class V1Role:
    def __init__(self, peer: PeerConnection, conn: Connection) -> None:
        self.peer = peer
        self.conn = conn
        self._pending: Batch | None = None  # sent, not yet acknowledged
        self._answer: Batch | None = None  # the batch answering the current record
        self._acked = asyncio.Event()
        self._ack_ok = False
        self._ack_seq = 0
        peer.intercept = self._intercept
        peer.on_lost_hook = lambda: self._settle(False)

    def _intercept(self, frame: v2.ClientFrame) -> bool:
        # Settled synchronously, before any later frame of the same read is queued:
        # whatever waits on the batch (a worker's busy flag, a reservation) is settled
        # before the shim's next record is handled, as in embedded mode.
        if isinstance(frame, v2.Written):
            self._settle(frame.seq == self._ack_seq)
            return True
        if isinstance(frame, v2.OutputFailed):
            self._settle(False)
            return True
        return False

    def _settle(self, ok: bool) -> None:
        batch, self._pending = self._pending, None
        if batch is None:
            return
        self._ack_ok = ok
        batch.written()
        self._acked.set()

    async def serve(self) -> None:
        peer, conn = self.peer, self.conn
        coordinator = peer.server.core.coordinator
        peer.send(peer.server.welcome("v1_shim"))
        writer = asyncio.create_task(self._writer())
        # An output failure ends the connection's input too: its work is cancelled now,
        # not when the shim next sends something (it may be stuck writing stdout).
        writer.add_done_callback(lambda _: peer.end_input())
        try:
            async for frame in peer.frames():
                if writer.done() or conn.output.closed or isinstance(frame, v2.Eof):
                    break
                if isinstance(frame, v2.Record):
                    batch = await coordinator.handle_record(conn, frame.data)
                else:
                    assert isinstance(frame, v2.Oversize)
                    batch = coordinator.reject_oversize(conn)
                if batch is not None:
                    # Its output frame says it answers the record: the shim reads the next
                    # record after writing and acknowledging it, with no extra round trip.
                    self._answer = batch
                    await wait_either(batch.done.wait(), writer)
                    continue
                if writer.done() or conn.output.closed:
                    break
                peer.send({"t": "next"})
        finally:
            await peer.server.core.close(conn)
            status, detail = await writer
        if status != "lost":
            peer.send({"t": "end", "status": status, "detail": detail})
            await bounded(peer.drain(), 5.0)

    async def _writer(self) -> tuple[str, str | None]:
        conn, peer = self.conn, self.peer
        while (batch := await conn.output.get()) is not None:
            try:
                data = encode_batch(batch.messages)
            except OutboundError as exc:
                log.warning("v1 output error")
                batch.written()
                conn.output.close()
                return "output_error", str(exc)
            if peer.lost.is_set():
                batch.written()
                conn.output.close()
                return "lost", None
            self._ack_seq += 1
            self._pending = batch
            self._acked.clear()
            frame = {"t": "output", "seq": self._ack_seq, "data": data}
            if batch is self._answer:
                frame["answers"] = True
                self._answer = None
            peer.send(frame)
            try:
                await asyncio.wait_for(self._acked.wait(), peer.server.client_timeout)
            except TimeoutError:
                # A shim that stopped writing stdout is an output failure, as v1 says
                # for a stuck stdout: its turns cancel and drain; nothing waits on it.
                log.warning("closing a connection code=%s", Code.CLIENT_STALLED.value)
                self._settle(False)
                conn.output.close()
                return "output_error", MESSAGES[Code.CLIENT_STALLED]
            if not self._ack_ok:
                conn.output.close()
                return ("lost" if peer.lost.is_set() else "output_error"), None
        return "ok", None
