"""The shim's bridging logic without I/O (RFC-0002 §5): stdin bytes and daemon frames in,
stdout bytes and daemon frames out.

Both drivers use it: the shim's own ``selectors`` loop (:mod:`magi_code.shim.bridge`) and
the in-memory one the tests run the conformance scenarios through, so the ordering rules
live here once:

- stdin is framed by the v1 :class:`~magi_code.protocol.framing.LineFramer` (LF/CRLF, the
  record bound; an oversize record becomes an ``oversize`` frame in its place);
- records are forwarded in order as they arrive, while fewer than :data:`WINDOW_RECORDS`
  forwarded records (and :data:`WINDOW_BYTES` of them) are unanswered. A record is answered
  by the ``output`` frame marked ``answers: true``, or by ``next`` (answered later by a
  worker). The daemon's own inbox bound (64 frames, 1 MiB) stays out of reach, so a full
  window never pauses its reading (and with it, the acknowledgements it waits for);
- every ``output`` frame's data is handed to the driver to write to stdout; only after
  the driver reports the write (:meth:`ShimCore.wrote`) are its acknowledgements queued
  (``written {seq}``, or ``output_failed`` once a write failed), and no record is
  forwarded while a write is outstanding. A record the frontend sends after reading an
  answer therefore always reaches the daemon after that answer's acknowledgement, which
  is what the daemon orders its work by;
- stdin EOF (or :meth:`ShimCore.stop`, SIGTERM/SIGINT) forwards the rest and then ``eof``;
  output continues until the daemon's ``end``. Exit status 0 when ``end`` says ``ok`` and
  every write succeeded, else 1; a connection lost before ``end`` is 1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final

from magi_code.protocol import v2
from magi_code.protocol.framing import TOO_LARGE, LineFramer
from magi_code.protocol.v2 import End, Next, Output, decode_shim_frame
from magi_code.turns.failures import MAX_LABEL_BYTES, MAX_REMEDY_BYTES, describe

WINDOW_RECORDS: Final = 32
# Record bytes in flight: half the daemon's 1 MiB inbox bound, and room for 8 records of
# the maximum size. One record is always admitted when none is in flight.
WINDOW_BYTES: Final = 512 * 1024
# What a record frame adds to its data (header, map, keys), rounded up.
FRAME_OVERHEAD: Final = 32

LOST: Final = "lost the connection to the daemon; stopping"
STDOUT_CLOSED: Final = "output error: stdout closed; stopping"
# Failed-turn lines printed per output frame at most (a frame carries one batch).
MAX_REPORTED_FAILURES: Final = 16


class ShimCore:
    """One bridged v1 service. Feed it, then act on what it holds; see the module text.

    A driver loop: feed stdin chunks (``b""`` at EOF) while :attr:`wants_stdin`, and daemon
    frames as they arrive; whenever :attr:`needs_write`, write :attr:`stdout` to stdout and
    report it with :meth:`wrote`; send :meth:`take_frames` to the daemon in order; print
    :meth:`take_diagnostics` on stderr; stop once :attr:`finished` (then :attr:`exit_code`
    is the process's exit status).
    """

    def __init__(self, *, window: int = WINDOW_RECORDS, window_bytes: int = WINDOW_BYTES) -> None:
        self._window = window
        self._window_bytes = window_bytes
        self._framer = LineFramer()
        self._records: deque[tuple[dict[str, Any], int]] = deque()  # read, not forwarded
        self._in_flight: deque[int] = deque()  # sizes of forwarded, unanswered records
        self._in_flight_bytes = 0
        self._frames: list[dict[str, Any]] = []  # for the daemon, in order
        self._stdout = bytearray()  # output data received, not yet written
        self._acks: list[object] = []  # seqs of those outputs, acknowledged after the write
        self._diagnostics: list[str] = []
        self.input_ended = False
        self._eof_sent = False
        self.output_failed = False
        self.exit_code: int | None = None

    # -- state for the driver ------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The bridge is over (``end`` or a lost connection) and all output was written."""
        return self.exit_code is not None and not self._acks

    @property
    def wants_stdin(self) -> bool:
        """Read stdin now: input goes on and every record read so far was forwarded."""
        return not self.input_ended and not self._records and self.exit_code is None

    @property
    def needs_write(self) -> bool:
        """Output arrived: write :attr:`stdout` (possibly empty) and call :meth:`wrote`."""
        return bool(self._acks)

    @property
    def stdout(self) -> bytes:
        return bytes(self._stdout)

    @property
    def in_flight(self) -> int:
        """Records forwarded and not yet answered."""
        return len(self._in_flight)

    def take_frames(self) -> list[dict[str, Any]]:
        frames, self._frames = self._frames, []
        return frames

    def take_diagnostics(self) -> list[str]:
        lines, self._diagnostics = self._diagnostics, []
        return lines

    # -- stdin -----------------------------------------------------------------------------

    def feed_stdin(self, data: bytes) -> None:
        """A chunk of stdin; ``b""`` is EOF (an unterminated last record still counts)."""
        if self.input_ended or self.exit_code is not None:
            return
        if data:
            records = self._framer.feed(data)
        else:
            records = self._framer.eof()
            self.input_ended = True
        for record in records:
            if record is TOO_LARGE:
                self._records.append((v2.oversize(), FRAME_OVERHEAD))
            else:
                assert isinstance(record, bytes)
                self._records.append((v2.record(record), len(record) + FRAME_OVERHEAD))
        self._forward()

    def stop(self) -> None:
        """SIGTERM/SIGINT: input ends here, as at stdin EOF."""
        self.feed_stdin(b"")

    # -- the daemon ------------------------------------------------------------------------

    def feed_frames(self, frames: Iterable[Mapping[str, Any]]) -> None:
        """Frames from the daemon, in order (those after ``end`` or a bad one are ignored)."""
        for frame in frames:
            if self.exit_code is not None:
                return
            match decode_shim_frame(frame):
                case Output() as output:
                    if not self.output_failed:
                        self._stdout += output.data
                    self._acks.append(output.seq)
                    self._report_failures(output.failures)
                    if output.answers:
                        self._answered()
                case Next():
                    self._answered()
                case End(status=status, detail=detail):
                    if status == "output_error" and detail:
                        self._diagnostics.append(f"output error: {detail}; stopping")
                    self.exit_code = 0 if status == "ok" and not self.output_failed else 1
                case None:
                    self.lost()
        self._forward()  # answers free the window (held while a write is outstanding)

    def lost(self) -> None:
        """The connection ended (closed, reset, invalid frames) before the daemon's ``end``."""
        if self.exit_code is None:
            self._diagnostics.append(LOST)
            self.exit_code = 1

    def wrote(self, ok: bool) -> None:
        """The driver wrote :attr:`stdout` (``ok``) or the write failed; acknowledge it."""
        if not ok and not self.output_failed:
            self._diagnostics.append(STDOUT_CLOSED)
            self.output_failed = True
        self._stdout.clear()
        acks, self._acks = self._acks, []
        if self.exit_code is not None:
            if self.output_failed:
                self.exit_code = 1  # output that came with ``end`` could not be written
            return
        if self.output_failed:
            self._frames.extend(v2.output_failed() for _ in acks)
            # An output failure ends the input too: nothing more is forwarded.
            self._records.clear()
            self.input_ended = True
        else:
            self._frames.extend(v2.written(seq) for seq in acks)
        self._forward()

    # -- internals -------------------------------------------------------------------------

    def _report_failures(self, failures: object) -> None:
        """``magi-code: turn <id> failed: <label> — <remedy>`` for each failed turn."""
        if not isinstance(failures, list):
            return
        for item in failures[:MAX_REPORTED_FAILURES]:
            if isinstance(item, dict):
                turn_id, label = item.get("turn_id"), item.get("failure")
                remedy = item.get("remedy")
                if isinstance(turn_id, str) and isinstance(label, str):
                    remedy = remedy[:MAX_REMEDY_BYTES] if isinstance(remedy, str) else None
                    line = describe(turn_id[:128], label[:MAX_LABEL_BYTES], remedy)
                    self._diagnostics.append(line)

    def _answered(self) -> None:
        if self._in_flight:
            self._in_flight_bytes -= self._in_flight.popleft()

    def _forward(self) -> None:
        if self._acks or self.exit_code is not None:
            return  # a write is outstanding: its acknowledgement goes first
        records, in_flight = self._records, self._in_flight
        while records:
            frame, size = records[0]
            if in_flight and (
                len(in_flight) >= self._window or self._in_flight_bytes + size > self._window_bytes
            ):
                return
            records.popleft()
            self._frames.append(frame)
            in_flight.append(size)
            self._in_flight_bytes += size
        if self.input_ended and not self._eof_sent:
            self._eof_sent = True
            self._frames.append(v2.eof())
