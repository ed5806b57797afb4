"""Incremental, sans-IO server-sent-events parser shared by every wire API.

Theory of operation (WHATWG "event stream interpretation", minus reconnection):
bytes are buffered and split into lines on ``\\r\\n``, ``\\n`` or ``\\r``; a ``\\r`` at
the very end of the buffer waits for the next feed, so chunking never changes the
result. Lines starting with ``:`` are comments (keep-alives); ``event:`` sets the type;
``data:`` lines are joined with ``\\n``; a blank line dispatches the event when it has
data. At EOF a pending event made of complete lines is dispatched; an unterminated
final line is dropped (it is a truncated write). Lines and events are bounded: going
over a bound raises ``ProviderFailure(provider_stream_error)`` — the only exception
this module raises.
"""

from __future__ import annotations

from typing import Final

from magi_code.dataclass import dataclass
from magi_code.providers.errors import FailureLabel, ProviderFailure

DEFAULT_MAX_LINE_BYTES: Final = 1 << 20
DEFAULT_MAX_EVENT_BYTES: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str

    @property
    def done(self) -> bool:
        """The OpenAI ``data: [DONE]`` sentinel (tolerating the bracketless form)."""
        data = self.data
        return data[:1] != "{" and data.strip() in ("[DONE]", "DONE")


class SSEParser:
    def __init__(
        self,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self._max_line = max_line_bytes
        self._max_event = max_event_bytes
        self._buf = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0
        self._closed = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events it completed (possibly none)."""
        if self._closed:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        events: list[SSEEvent] = []
        if not self._buf and b"\r" not in chunk:
            # The usual chunk, one or more whole lines: split at once.
            *lines, rest = chunk.split(b"\n")
            for line in lines:
                self._line(line, events)
            self._buf += rest
        else:
            self._buf += chunk
            self._take_lines(events)
        if len(self._buf) > self._max_line:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        return events

    def _take_lines(self, events: list[SSEEvent]) -> None:
        """Handle the buffer's complete lines (any line ending) and keep the rest."""
        buf = self._buf
        start = 0
        size = len(buf)
        while start < size:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl >= 0 else size)
            if cr >= 0:
                if cr + 1 == size:
                    break  # maybe the first half of "\r\n": wait for more bytes
                end, nxt = cr, cr + 2 if buf[cr + 1] == 0x0A else cr + 1
            elif nl >= 0:
                end, nxt = nl, nl + 1
            else:
                break
            self._line(bytes(buf[start:end]), events)
            start = nxt
        del buf[:start]

    def close(self) -> list[SSEEvent]:
        """Signal EOF; returns a last event if complete lines were pending."""
        if self._closed:
            return []
        events: list[SSEEvent] = []
        if self._buf.endswith(b"\r"):
            self._line(bytes(self._buf[:-1]), events)
        self._buf.clear()
        self._closed = True
        self._dispatch(events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if len(raw) > self._max_line:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        if not raw:
            self._dispatch(events)
            return
        if raw[0] == 0x3A:  # ":" comment / keep-alive
            return
        line = raw.decode("utf-8", errors="replace")
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data_bytes += len(raw)
            if self._data_bytes > self._max_event:
                raise ProviderFailure(FailureLabel.STREAM_ERROR)
            self._data.append(value)
        elif name == "event":
            self._event = value
        # "id", "retry" and unknown fields are ignored: no reconnection here.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            events.append(SSEEvent(self._event or "message", "\n".join(self._data)))
        self._event = ""
        self._data = []
        self._data_bytes = 0
