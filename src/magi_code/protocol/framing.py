"""Sans-IO JSONL framing with a hard record bound.

Records end in LF; a CR before the LF is stripped. A record whose bytes, including its
newline, exceed ``max_record_bytes`` is discarded through its newline and reported once as
``TOO_LARGE``, and framing resumes with the next record. The buffer never holds more than
one record's worth of bytes. At EOF a final unterminated fragment is still a record.
"""

from __future__ import annotations

from typing import Final

from .limits import MAX_RECORD_BYTES


class _TooLarge:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_LARGE"


TOO_LARGE: Final = _TooLarge()

Frame = bytes | _TooLarge


def fits_record(length: int, max_record_bytes: int = MAX_RECORD_BYTES) -> bool:
    """Whether a record of ``length`` bytes, without its line ending, is within the bound
    (which counts its newline)."""
    return length + 1 <= max_record_bytes


class LineFramer:
    def __init__(self, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self._max = max_record_bytes
        self._buffer = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[Frame]:
        """Consume ``data``; return the complete records it finished, in order."""
        frames: list[Frame] = []
        start = 0
        end = len(data)
        while start < end:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._append_partial(data[start:])
                break
            if self._discarding:
                self._discarding = False
                frames.append(TOO_LARGE)
            elif not fits_record(len(self._buffer) + newline - start, self._max):
                self._buffer.clear()
                frames.append(TOO_LARGE)
            else:
                self._buffer += data[start:newline]
                frames.append(self._take())
            start = newline + 1
        return frames

    def eof(self) -> list[Frame]:
        """Flush at end of input: an unterminated final record still counts."""
        if self._discarding:
            self._discarding = False
            return [TOO_LARGE]
        if self._buffer:
            return [self._take()]
        return []

    def _append_partial(self, chunk: bytes) -> None:
        if self._discarding:
            return
        # Room for the newline that must still come.
        if not fits_record(len(self._buffer) + len(chunk), self._max):
            self._buffer.clear()
            self._discarding = True
            return
        self._buffer += chunk

    def _take(self) -> bytes:
        record = bytes(self._buffer)
        self._buffer.clear()
        if record.endswith(b"\r"):
            record = record[:-1]
        return record
