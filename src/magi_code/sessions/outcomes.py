"""Turn outcomes from the whole session history (blocking reads; no writes here).

Replay only looks at the recent window; a daemon recovering after a restart or crash must
also answer for old turns ("what happened to turn T", "which turn did key K start"). The
scan here streams ``[0, end)`` of ``history.jsonl`` in bounded chunks, where ``end`` is
the end of the last complete line when the caller snapshotted the file under the append
lock: those bytes never change again, so the scan itself needs no lock. It skips what
replay skips (torn or malformed lines, lines over the record size bound, ``seq`` values
that do not increase) and keeps only the state of the one turn it is looking for.

A turn is its ``user`` record (the latest matching one) plus the ``assistant`` and the
first ``terminal`` record with the same ``turn_id`` after it; anything of that turn after
its terminal is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.sessions.fileio import pread_all
from magi_code.sessions.records import (
    AssistantRecord,
    TerminalRecord,
    TerminalStatus,
    UserRecord,
    decode_line_ts,
    parse_ts,
)

SCAN_CHUNK_BYTES: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """What durable history says about one turn.

    ``status`` is the terminal record's status, or ``None`` while the turn has no terminal
    (still running, or its process died mid-turn). ``assistant_text`` is the terminal's
    ``assistant_text``, or without a terminal the concatenated ``assistant`` records
    persisted so far. ``sequence``, ``failure`` and ``remedy`` are the terminal's (``None``
    without one or when the terminal carries none); ``idempotency_key`` and
    ``accepted_at`` (the user record's ``ts`` in Unix seconds) come from the user record.
    """

    turn_id: str
    status: TerminalStatus | None
    assistant_text: str
    sequence: int | None
    idempotency_key: str | None
    accepted_at: float | None
    failure: str | None = None
    remedy: str | None = None


def iter_lines(fd: int, end: int, max_line: int) -> Iterator[bytes]:
    """Each complete line in ``[0, end)`` of ``fd`` without its ``\\n``, in order.

    Reads ``SCAN_CHUNK_BYTES`` at a time and holds at most ``max_line`` bytes of one line;
    longer lines (which no append could have written) are dropped. A final segment
    without ``\\n`` (only possible if the file shrank under the caller) is dropped too.
    """
    pos = 0
    parts: list[bytes] = []
    held = 0
    overlong = False
    while pos < end:
        chunk = pread_all(fd, min(SCAN_CHUNK_BYTES, end - pos), pos)
        if not chunk:
            return
        pos += len(chunk)
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            if not overlong and held + newline - start <= max_line:
                parts.append(chunk[start:newline])
                yield b"".join(parts)
            parts, held, overlong = [], 0, False
            start = newline + 1
        if overlong:
            continue
        rest = chunk[start:]
        if held + len(rest) > max_line:
            parts, held, overlong = [], 0, True
        elif rest:
            parts.append(rest)
            held += len(rest)


class _Turn:
    __slots__ = ("accepted_at", "key", "terminal", "texts", "turn_id")

    def __init__(self, user: UserRecord, ts: object) -> None:
        self.turn_id = user.turn_id
        self.key = user.idempotency_key
        self.accepted_at = parse_ts(ts)
        self.texts: list[str] = []
        self.terminal: TerminalRecord | None = None

    def outcome(self) -> TurnOutcome:
        end = self.terminal
        if end is None:
            text = "".join(self.texts)
            return TurnOutcome(self.turn_id, None, text, None, self.key, self.accepted_at)
        return TurnOutcome(
            self.turn_id,
            end.status,
            end.assistant_text,
            end.sequence,
            self.key,
            self.accepted_at,
            end.failure,
            end.remedy,
        )


def scan_turn(
    fd: int, end: int, max_line: int, matches: Callable[[UserRecord], bool]
) -> TurnOutcome | None:
    """The outcome of the latest turn whose user record ``matches``, or ``None``."""
    current: _Turn | None = None
    last_seq = -1
    for line in iter_lines(fd, end, max_line):
        decoded = decode_line_ts(line)
        if decoded is None or decoded[0].seq <= last_seq:
            continue
        record, ts = decoded
        last_seq = record.seq
        # A steer's user record is inside its turn, not the start of one.
        if isinstance(record, UserRecord) and not record.steer and matches(record):
            current = _Turn(record, ts)
        elif current is None or current.terminal is not None:
            continue
        elif isinstance(record, AssistantRecord) and record.turn_id == current.turn_id:
            current.texts.append(record.text)
        elif isinstance(record, TerminalRecord) and record.turn_id == current.turn_id:
            current.terminal = record
    return None if current is None else current.outcome()
