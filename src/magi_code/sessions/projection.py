"""Replay projection, cursors and paging (pure, no I/O).

Theory of operation
-------------------
``parse_window`` turns the bytes of the recent history window into records, skipping a
partial first line (when the window starts mid-file), torn or malformed lines and
out-of-order sequence numbers; each of those sets ``gap``.

``project`` maps records to the allowlisted frontend items: the latest valid compaction
summary first, then user/assistant messages and terminal items after its cutoff. Text is
split into parts of at most ``MAX_PART_BYTES`` UTF-8 bytes.

Every item has a stable key ``(seq, sub, part)`` - the record it comes from, which item of
that record, which text part - and a digest of its content. A cursor encodes the session,
the projection *basis* (the compaction checkpoint in effect, if any), the item key and
digest. History is append-only, so an item that is still present with the same basis and
digest has the same projected prefix before it: the cursor survives restarts and appends,
and a new checkpoint, a rewrite or the window moving past the item makes it stale
(``resync_required``). The start cursor means "nothing accepted yet" and is always valid.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Sequence
from typing import Final

import orjson

from magi_code.dataclass import dataclass, field
from magi_code.protocol.limits import MAX_ID_BYTES, MAX_SESSION_REPLAY_PAGE_BYTES
from magi_code.protocol.text import utf8_parts
from magi_code.sessions.records import (
    AssistantRecord,
    CompactionRecord,
    HeaderRecord,
    Record,
    TerminalRecord,
    UnknownRecord,
    UserRecord,
    decode_line,
)

MAX_PART_BYTES: Final = 2048
MAX_WINDOW_RECORDS: Final = 100_000

_CURSOR_VERSION: Final = 1
_START: Final = struct.Struct(">B8sB")
_ITEM: Final = struct.Struct(">B8sBQQBI12s")
_KIND_START: Final = 0
_KIND_ITEM: Final = 1


@dataclass(slots=True)
class ParsedWindow:
    records: list[Record] = field(default_factory=list)
    gap: bool = False
    # True when the window does not start at the beginning of the file.
    omitted_prefix: bool = False
    # The latest compaction checkpoint among ``records`` (found once per parse).
    compaction: CompactionRecord | None = None


def parse_window(data: bytes, at_file_start: bool, session_id: str) -> ParsedWindow:
    """Records in a window of history bytes; see the module docstring for ``gap``."""
    out = ParsedWindow(omitted_prefix=not at_file_start)
    if not at_file_start:
        # The first segment may be the tail of a record that started before the window.
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    lines = data.split(b"\n")
    if lines[-1]:
        out.gap = True  # torn tail: a crash interrupted an append
    lines.pop()
    if len(lines) > MAX_WINDOW_RECORDS:
        lines = lines[-MAX_WINDOW_RECORDS:]
        out.omitted_prefix = True
    last_seq = -1
    for line in lines:
        record = decode_line(line)
        if record is None or record.seq <= last_seq:
            out.gap = True
            continue
        if isinstance(record, HeaderRecord) and record.session_id != session_id:
            out.gap = True
            continue
        last_seq = record.seq
        out.records.append(record)
    if at_file_start and not (out.records and isinstance(out.records[0], HeaderRecord)):
        out.gap = True
    out.compaction = latest_compaction(out.records)
    return out


def latest_compaction(records: Sequence[Record]) -> CompactionRecord | None:
    for record in reversed(records):
        if isinstance(record, CompactionRecord):
            return record
    return None


def window_omits_history(window: ParsedWindow, compaction: CompactionRecord | None) -> bool:
    """Whether records the projection needs lie before the window.

    Sequence numbers are contiguous, so with a checkpoint nothing is missing when the
    first record in the window directly follows (or precedes) the cutoff.
    """
    if not window.omitted_prefix:
        return False
    if compaction is None or not window.records:
        return True
    return window.records[0].seq > compaction.cutoff_seq + 1


@dataclass(frozen=True, slots=True)
class Item:
    seq: int
    sub: int
    part: int
    body: dict[str, object]
    digest: bytes


@dataclass(frozen=True, slots=True)
class Projection:
    items: list[Item]
    basis: int  # seq of the compaction checkpoint in effect, or -1
    # (seq, sub, part) -> index in ``items``: a cursor resolves without a scan
    positions: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for index, item in enumerate(self.items):
            self.positions[(item.seq, item.sub, item.part)] = index


def _text_items(
    seq: int, sub: int, head: dict[str, object], text: str, first: int = 0
) -> list[Item]:
    """``text`` in parts numbered from ``first`` (a message continued from an earlier record)."""
    parts = utf8_parts(text, MAX_PART_BYTES)
    items = []
    for index, part in enumerate(parts, start=first):
        last = index == first + len(parts) - 1
        body = {**head, "text": part, "part": index, "last_part": last}
        items.append(Item(seq, sub, index, body, _digest(body)))
    return items


def _digest(body: dict[str, object]) -> bytes:
    return hashlib.blake2b(orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=12).digest()


def project(records: Sequence[Record]) -> Projection:
    compaction = latest_compaction(records)
    cutoff = compaction.cutoff_seq if compaction else -1
    # Turns that settled an assistant message before their terminal. Only earlier records
    # count, so a later append can never change an already projected item.
    answered: set[str] = set()
    items: list[Item] = []
    if compaction is not None:
        items += _text_items(compaction.seq, 0, {"kind": "summary"}, compaction.summary)
    # A reply persisted in increments while it streamed is one message: an increment
    # (``continued``) leaves it open, and its parts go on in the turn's next assistant
    # record. Nothing already projected changes: a message still open when anything else
    # comes (the turn died mid-reply) is closed by an empty last part.
    open_reply: tuple[str, int] | None = None  # (turn_id, next part number)

    def close_reply(seq: int) -> None:
        nonlocal open_reply
        if open_reply is not None and open_reply[1] > 0:
            body = {**_message("assistant"), "text": "", "part": open_reply[1], "last_part": True}
            items.append(Item(seq, 2, open_reply[1], body, _digest(body)))
        open_reply = None

    for record in records:
        if isinstance(record, AssistantRecord):
            answered.add(record.turn_id)
        if record.seq <= cutoff:
            continue
        if isinstance(record, AssistantRecord):
            if open_reply is not None and open_reply[0] != record.turn_id:
                close_reply(record.seq)
            first = open_reply[1] if open_reply is not None else 0
            parts: list[Item] = []
            if record.text or first:  # an empty record matters only to end a message
                parts = _text_items(record.seq, 0, _message("assistant"), record.text, first)
                if record.continued:
                    parts[-1] = _reopened(parts[-1])
            items += parts
            open_reply = (record.turn_id, first + len(parts)) if record.continued else None
            continue
        if isinstance(record, UnknownRecord | HeaderRecord | CompactionRecord):
            continue  # not part of the conversation: an open message stays open
        close_reply(record.seq)
        if isinstance(record, UserRecord):
            items += _text_items(record.seq, 0, _message("user"), record.text)
        elif isinstance(record, TerminalRecord):
            # Accepted partial text of a stopped turn that never settled a message.
            if record.assistant_text and record.turn_id not in answered:
                items += _text_items(record.seq, 0, _message("assistant"), record.assistant_text)
            body: dict[str, object] = {"kind": "terminal", "status": record.status}
            items.append(Item(record.seq, 1, 0, body, _digest(body)))
    return Projection(items, compaction.seq if compaction else -1)


def _reopened(item: Item) -> Item:
    body = {**item.body, "last_part": False}
    return Item(item.seq, item.sub, item.part, body, _digest(body))


def _message(role: str) -> dict[str, object]:
    return {"kind": "message", "role": role}


def _session_digest(session_id: str) -> bytes:
    return hashlib.blake2b(session_id.encode(), digest_size=8, person=b"mc-session").digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def start_cursor(session_id: str) -> str:
    return _b64(_START.pack(_CURSOR_VERSION, _session_digest(session_id), _KIND_START))


def item_cursor(session_id: str, basis: int, item: Item) -> str:
    raw = _ITEM.pack(
        _CURSOR_VERSION,
        _session_digest(session_id),
        _KIND_ITEM,
        basis + 1,
        item.seq,
        item.sub,
        item.part,
        item.digest,
    )
    return _b64(raw)


def resolve_cursor(session_id: str, projection: Projection, cursor: str) -> int | None:
    """Index of the first item after ``cursor``, or ``None`` when it does not match."""
    if not cursor.isascii() or len(cursor) > MAX_ID_BYTES:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        return None
    if _b64(raw) != cursor:
        return None  # only the canonical encoding names a position
    if len(raw) == _START.size:
        version, digest, kind = _START.unpack(raw)
        ok = (version, digest, kind) == (_CURSOR_VERSION, _session_digest(session_id), _KIND_START)
        return 0 if ok else None
    if len(raw) != _ITEM.size:
        return None
    version, digest, kind, basis, seq, sub, part, item_digest = _ITEM.unpack(raw)
    if (version, digest, kind) != (_CURSOR_VERSION, _session_digest(session_id), _KIND_ITEM):
        return None
    if basis != projection.basis + 1:
        return None
    index = projection.positions.get((seq, sub, part))
    if index is None:
        return None
    return index + 1 if projection.items[index].digest == item_digest else None


def build_page(
    session_id: str,
    projection: Projection,
    after: str | None,
    limit: int,
    gap: bool,
) -> dict[str, object]:
    """The ``session.replay`` success payload for one page (at most 16 KiB encoded)."""
    items = projection.items
    end = (
        item_cursor(session_id, projection.basis, items[-1]) if items else start_cursor(session_id)
    )
    start = 0 if after is None else resolve_cursor(session_id, projection, after)
    if start is None:
        return _payload([], start_cursor(session_id), end, bool(items), gap, resync=True)
    position = (
        item_cursor(session_id, projection.basis, items[start - 1])
        if start > 0
        else start_cursor(session_id)
    )
    events: list[dict[str, object]] = []
    payload = _payload(events, position, end, start < len(items), gap, resync=False)
    for item in items[start : start + limit]:
        cursor = item_cursor(session_id, projection.basis, item)
        done = start + len(events) + 1
        candidate = _payload(
            [*events, {"cursor": cursor, **item.body}], cursor, end, done < len(items), gap, False
        )
        if len(orjson.dumps(candidate)) > MAX_SESSION_REPLAY_PAGE_BYTES:
            break
        events.append({"cursor": cursor, **item.body})
        payload = candidate
    return payload


def _payload(
    events: list[dict[str, object]],
    next_cursor: str,
    snapshot_cursor: str,
    truncated: bool,
    gap: bool,
    resync: bool,
) -> dict[str, object]:
    return {
        "events": events,
        "next_cursor": next_cursor,
        "snapshot_cursor": snapshot_cursor,
        "truncated": truncated,
        "gap": gap,
        "resync_required": resync,
    }
