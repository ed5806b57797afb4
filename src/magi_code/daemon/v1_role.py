"""The ``v1_shim`` role (RFC-0002 §5): one v1 stdio service, bridged through the shim.

The connection *is* a v1 service and drives the embedded adapter's rules exactly
(``core/v1.py``); this role adds only the frames:

- records are handled in order, each only once the answer to the one before it is
  written: acknowledged by the shim after its stdout write (a record answered later by
  a worker, ``next``, does not wait). After an output failure no record the shim
  forwarded behind the failed answer takes effect;
- every take of queued batches goes out as ``output`` frames, one per batch (at most
  :data:`MAX_OUTPUTS_IN_FLIGHT` unacknowledged, and the connection's outbound limit in
  bytes, one always allowed); each batch is settled (``Batch.written()``: its request
  IDs are released) when the shim acknowledges having written it. Acknowledgements are
  settled as they are read, before any later frame of the same read is queued, and the
  shim sends each before any record it reads afterwards, so a frontend that reuses a
  request ID after reading its answer finds it free, as in embedded mode;
- a batch that cannot be encoded ends the output after the batches before it
  (``output_error``), as embedded mode stops writing.

A record frame is checked as the shim's framer checks a line: one over the v1 record
bound is answered ``record_too_large`` (``protocol/v2.py`` reads it as ``oversize``), and
the coordinator applies every other v1 bound, so a client that connects as a shim
directly gets the contract's errors.

Its end (EOF, shim death, owner drop) cancels and drains its turns and login; their
terminal events still reach the shim while it is connected. A shim that leaves an
output unacknowledged for the server's ``client_timeout`` (its frontend stopped reading
stdout) is an output failure: its work is cancelled and drained, so it cannot hold turns
or workers that other frontends need.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from magi_code.core.coordinator import Connection
from magi_code.core.output import Batch
from magi_code.core.v1 import V1Connection, next_take
from magi_code.protocol import v2
from magi_code.protocol.frames import encode_frame
from magi_code.protocol.framing import TOO_LARGE, Frame
from magi_code.protocol.v2 import MESSAGES, Code

from .waits import bounded

if TYPE_CHECKING:
    from .connection import PeerConnection

log = logging.getLogger("magi_code.daemon")

# ``output`` frames sent and not yet acknowledged before the writer waits.
MAX_OUTPUTS_IN_FLIGHT: Final = 64


class V1Role:
    def __init__(self, peer: PeerConnection, conn: Connection) -> None:
        self.peer = peer
        self.conn = conn
        # Sent, not yet acknowledged: (seq, batch, its frame's size, when it was sent).
        self._in_flight: deque[tuple[int, Batch, int, float]] = deque()
        self._in_flight_bytes = 0
        self._answers: deque[Batch] = deque()  # batches answering a record, not yet sent
        self._seq = 0
        self._room = asyncio.Event()  # an acknowledgement or a failure arrived
        self._failed = False  # output failed, acknowledgements went wrong, or the shim left
        self._stalled = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        peer.intercept = self._intercept
        peer.on_lost_hook = self._fail

    # -- acknowledgements (settled synchronously, in the transport's read) ------------------

    def _intercept(self, frame: v2.ClientFrame) -> bool:
        # Settled before any later frame of the same read is queued: whatever waits on the
        # batch (a reserved request ID, a worker's busy flag) is settled before the shim's
        # next record is handled, as in embedded mode.
        if isinstance(frame, v2.Written):
            if not self._in_flight:
                return True  # nothing was sent: nothing to settle
            seq, batch, size, _ = self._in_flight[0]
            if frame.seq != seq:
                self._fail()
                return True
            self._in_flight.popleft()
            self._in_flight_bytes -= size
            batch.written()
            self._room.set()
            return True
        if isinstance(frame, v2.OutputFailed):
            self._fail()
            return True
        return False

    def _fail(self) -> None:
        """The shim cannot write (or is gone): settle what was sent, end the output."""
        self._failed = True
        while self._in_flight:
            self._in_flight.popleft()[1].written()
        self._in_flight_bytes = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.conn.output.close()  # settles what is queued and wakes the writer
        self._room.set()

    def _watch_stall(self) -> None:
        """Time the oldest unacknowledged output from when it was sent.

        One timer at a time, never moved by an acknowledgement: when it fires it looks at
        the output that is oldest then (so the steady state costs no timer per frame).
        """
        self._timer = None
        if not self._in_flight:
            return
        deadline = self._in_flight[0][3] + self.peer.server.client_timeout
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._watch_stall)
            return
        # A shim that stopped writing stdout is an output failure, as v1 says for a stuck
        # stdout: its turns cancel and drain; nothing waits on it.
        log.warning("closing a connection code=%s", Code.CLIENT_STALLED.value)
        self._stalled = True
        self._fail()

    # -- the role ---------------------------------------------------------------------------

    async def serve(self) -> None:
        peer, conn = self.peer, self.conn
        coordinator = peer.server.core.coordinator
        peer.send(peer.server.welcome("v1_shim"))
        writer = asyncio.create_task(self._writer())
        # An output failure ends the connection's input too: its work is cancelled now,
        # not when the shim next sends something (it may be stuck writing stdout).
        writer.add_done_callback(lambda _: peer.end_input())
        records = V1Connection(coordinator, conn, writer, self._handled)
        try:
            async for frame in peer.frames():
                if isinstance(frame, v2.Eof):
                    break
                if isinstance(frame, v2.Record):
                    record: Frame = frame.data
                else:
                    assert isinstance(frame, v2.Oversize)
                    record = TOO_LARGE
                if not await records.feed(record):
                    break
        finally:
            await peer.server.core.close(conn)
            status, detail = await writer
            if self._timer is not None:  # the output ended: nothing is left to time
                self._timer.cancel()
                self._timer = None
        if status != "lost":
            peer.send(v2.end(status, detail))
            await bounded(peer.drain(), 5.0)

    def _handled(self, batch: Batch | None) -> None:
        if batch is None:
            self.peer.send(v2.next_record())  # answered later, by a worker
        else:
            # Its output frame says it answers the record. (Nothing ran since it was
            # queued, so the writer has not taken it yet.)
            self._answers.append(batch)

    async def _writer(self) -> tuple[str, str | None]:
        conn, peer = self.conn, self.peer
        while not self._failed and (take := await next_take(conn.output)) is not None:
            for batch in take.batches:
                # The journal and the session's watchers see a shim's turns too.
                for event in batch.turn_events:
                    peer.server.core.record(event)
            self._send(
                [
                    self._output_frame(b, data)
                    for b, data in zip(take.batches, take.data, strict=True)
                ]
            )
            if take.failure is not None:
                log.warning("v1 output error")
                await self._acknowledged(lambda: not self._in_flight)
                return "output_error", str(take.failure)
            await self._acknowledged(self._has_room)
        # The output ended (the connection closed, or a failure): wait for what is sent.
        await self._acknowledged(lambda: not self._in_flight)
        if self._stalled:
            return "output_error", MESSAGES[Code.CLIENT_STALLED]
        if self._failed:
            conn.output.close()
            return ("lost" if peer.lost.is_set() else "output_error"), None
        return "ok", None

    def _output_frame(self, batch: Batch, data: bytes) -> bytes:
        self._seq += 1
        answers = bool(self._answers) and self._answers[0] is batch
        if answers:
            self._answers.popleft()
        # The shim prints why its turns failed (it does not parse the v1 records).
        failures = [
            {"turn_id": t, "failure": label, "remedy": remedy}
            for t, label, remedy in batch.failures()
        ]
        frame = encode_frame(v2.output(self._seq, data, answers, failures))
        self._in_flight.append((self._seq, batch, len(frame), self._loop.time()))
        self._in_flight_bytes += len(frame)
        if self._timer is None:
            self._watch_stall()
        return frame

    def _send(self, frames: list[bytes]) -> None:
        """Every frame of one take in one transport write (dropped once the shim is gone)."""
        if frames:
            self.peer.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def _has_room(self) -> bool:
        return not self._in_flight or (
            len(self._in_flight) < MAX_OUTPUTS_IN_FLIGHT
            and self._in_flight_bytes < self.peer.server.outbound_limit
        )

    async def _acknowledged(self, ready: Any) -> None:
        """Until ``ready()`` holds or the output failed."""
        while not self._failed and not ready():
            self._room.clear()
            await self._room.wait()
