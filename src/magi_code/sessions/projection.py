"""Replay projection, cursors and paging (pure, no I/O).

Theory of operation
-------------------
``parse_window`` turns the bytes of the recent history window into records, skipping a
partial first line (when the window starts mid-file), torn or malformed lines and
out-of-order sequence numbers; each of those sets ``gap``.

``project`` maps records to the allowlisted frontend items: the latest valid compaction
summary first, then user/assistant messages and terminal items after its cutoff. Each
message's whole text is split into parts of at most ``MAX_PART_BYTES`` UTF-8 bytes, a
streamed reply's increments (``continued`` records) joined first.

Every item has a stable key ``(seq, sub, part)`` - the record it comes from (for a reply,
its first record with text), which item of that record, which text part - and a digest
of its content. A cursor encodes the session, the projection *basis* (the compaction
checkpoint in effect, if any), the item key and digest. History is append-only, and the
only item an append can change is the last part of a reply still streaming (its text
grows, or it stops being the last part); every item before it stays. So an item that is
still present with the same basis and digest has the same projected prefix before it:
the cursor survives restarts and appends, and a new checkpoint, a rewrite, the window
moving past the item, or more text for the part it names makes it stale
(``resync_required``). The start cursor means "nothing accepted yet" and is always valid.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import Final

import orjson

from magi_code.dataclass import dataclass, field
from magi_code.protocol.limits import MAX_ID_BYTES, MAX_SESSION_REPLAY_PAGE_BYTES
from magi_code.protocol.text import utf8_parts
from magi_code.sessions.records import (
    ApprovalRecord,
    AssistantRecord,
    CompactionRecord,
    HeaderRecord,
    Record,
    RewindRecord,
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
    # Where each record's line starts in the file, the file offset just past the window
    # and the last record's line: what ``extend_window`` needs to go on from here. (An
    # array: 8 bytes an offset, where a list holds an int object of 32 besides.)
    starts: array[int] = field(default_factory=lambda: array("q"))
    end: int = 0
    last_line: bytes = b""
    # True when the records start at the latest compaction checkpoint's cutoff: what a
    # turn's context needs (``context_tail``), not the replay window.
    context_only: bool = False


def parse_window(data: bytes, offset: int, session_id: str) -> ParsedWindow:
    """Records in a window of history bytes read from file offset ``offset``; see the
    module docstring for ``gap``.

    The lines are decoded where they lie, one at a time: a window is up to 2 MiB of
    small lines, and splitting it first would make all of them objects at once, a peak
    that follows the session's length and that the allocator keeps. Equal IDs, tool
    names and texts among the records are one string (a turn's records all name it, and
    a terminal repeats its reply): a window stays parsed while it is cached and while a
    turn reads it.
    """
    out = ParsedWindow(omitted_prefix=offset > 0, end=offset + len(data))
    position = 0
    if offset > 0:
        # The first segment may be the tail of a record that started before the window.
        position = data.find(b"\n") + 1 or len(data)
    stop = max(position, data.rfind(b"\n") + 1)  # just past the last complete line
    if stop < len(data):
        out.gap = True  # torn tail: a crash interrupted an append
    excess = data.count(b"\n", position, stop) - MAX_WINDOW_RECORDS
    if excess > 0:
        for _ in range(excess):
            position = data.index(b"\n", position) + 1
        out.omitted_prefix = True
    last_seq, strings = -1, dict[str, str]()
    while position < stop:
        newline = data.index(b"\n", position)
        line = data[position:newline]
        start, position = position, newline + 1
        record = decode_line(line, strings)
        if record is None or record.seq <= last_seq:
            out.gap = True
            continue
        if isinstance(record, HeaderRecord) and record.session_id != session_id:
            out.gap = True
            continue
        last_seq = record.seq
        out.records.append(record)
        out.starts.append(offset + start)
        out.last_line = line
    if offset == 0 and not (out.records and isinstance(out.records[0], HeaderRecord)):
        out.gap = True
    out.compaction = latest_compaction(out.records)
    return out


# How the history's own encoder writes these types (a line found by one is decoded to be
# sure: the same bytes can be a key and value in a tool call's arguments).
_COMPACTION_MARK: Final = b'"type":"compaction"'
_REWIND_MARK: Final = b'"type":"rewind"'


def checkpoint_tail(data: bytes) -> int | None:
    """Where, in a window's bytes, the lines after the latest compaction checkpoint's
    cutoff begin (the start of a line): all that a turn's context needs from the window.

    Found by searching the bytes, decoding only the lines it lands on. ``None`` where only
    a whole parse can say: no checkpoint, a rewind among those lines (it may take the
    checkpoint back), or lines not where their contiguous ``seq`` puts them.
    """
    end = len(data)
    while True:
        mark = data.rfind(_COMPACTION_MARK, 0, end)
        if mark < 0:
            return None
        start = data.rfind(b"\n", 0, mark) + 1
        if start == 0:  # the window's first line: it may be the tail of an earlier one
            return None
        checkpoint = decode_line(data[start : data.find(b"\n", mark)])
        if isinstance(checkpoint, CompactionRecord):
            break
        end = start
    for _ in range(checkpoint.seq - checkpoint.cutoff_seq - 1):
        start = data.rfind(b"\n", 0, start - 1) + 1
        if start == 0:
            return None
    first = decode_line(data[start : data.find(b"\n", start)])
    if first is None or first.seq != checkpoint.cutoff_seq + 1:
        return None
    return None if data.find(_REWIND_MARK, start) >= 0 else start


def records_backward(data: bytes, offset: int) -> Iterator[Record]:
    """The records in a window's bytes (read from file offset ``offset``), the last first,
    decoding only as far as the caller reads. Malformed lines and a torn tail are skipped,
    and so is the first line when the window does not start the file (see
    ``parse_window``)."""
    first = 0
    if offset > 0:
        first = data.find(b"\n") + 1
        if first == 0:
            return
    end = data.rfind(b"\n")
    while end >= first:
        start = max(first, data.rfind(b"\n", first, end) + 1)
        record = decode_line(data[start:end])
        if record is not None:
            yield record
        end = start - 1


def extend_window(window: ParsedWindow, appended: bytes, offset: int) -> ParsedWindow | None:
    """What ``parse_window`` gives for the window from ``offset`` (at or after
    ``window``'s) once ``appended`` follows ``window.end`` in the file, parsing only
    ``appended``; ``window`` is not changed.

    ``None`` where only a whole parse can say: a gap in ``window``, a torn tail, an
    appended line that is not a well-formed record after the last one (a header too), or
    a rewind appended to a ``context_only`` window (it may take the checkpoint back).
    """
    if window.gap or not window.records or not appended.endswith(b"\n"):
        return None
    lines = appended.split(b"\n")
    lines.pop()
    records = window.records[:]
    starts = window.starts[:]
    position = window.end
    last_seq = records[-1].seq
    compaction, strings = window.compaction, dict[str, str]()
    for line in lines:
        record = decode_line(line, strings)
        if record is None or record.seq <= last_seq or isinstance(record, HeaderRecord):
            return None
        if window.context_only and type(record) is RewindRecord:
            return None
        last_seq = record.seq
        records.append(record)
        starts.append(position)
        position += len(line) + 1
        if isinstance(record, CompactionRecord):
            compaction = record
    # The window keeps the lines that start after its first byte (see ``parse_window``).
    first = bisect.bisect_left(starts, offset + 1) if offset > 0 else 0
    if len(records) - first > MAX_WINDOW_RECORDS:
        return None
    del records[:first], starts[:first]
    if compaction is not None and not (records and compaction.seq >= records[0].seq):
        compaction = None  # the checkpoint left the window, and no later one is in it
    last_line = lines[-1] if records else b""
    omitted = offset > 0 or window.context_only
    return ParsedWindow(
        records, False, omitted, compaction, starts, position, last_line, window.context_only
    )


def context_tail(window: ParsedWindow) -> ParsedWindow | None:
    """``window`` from the first record after its compaction checkpoint's cutoff, which
    is all a turn's context needs of it (what ``checkpoint_tail`` finds in bytes), as a
    window ``extend_window`` goes on from; the records are ``window``'s own.

    ``None`` where nothing lies before the cutoff, or where only the whole window can
    say: a gap, the first record after the cutoff not in the window, or a rewind from
    there on (it may take the checkpoint back).
    """
    compaction, records = window.compaction, window.records
    if compaction is None or window.gap:
        return None
    first = bisect.bisect_right(records, compaction.cutoff_seq, key=attrgetter("seq"))
    if first == 0 or first == len(records) or records[first].seq != compaction.cutoff_seq + 1:
        return None
    tail = records[first:]
    if any(type(record) is RewindRecord for record in tail):
        return None
    starts = window.starts[first:]
    return replace(window, records=tail, starts=starts, omitted_prefix=True, context_only=True)


def latest_compaction(records: Sequence[Record]) -> CompactionRecord | None:
    for record in reversed(records):
        if isinstance(record, CompactionRecord):
            return record
    return None


def effective(records: Sequence[Record]) -> Sequence[Record]:
    """``records`` without those rewinds took back: a ``RewindRecord`` drops every record
    after its ``to_seq`` and before itself, except a compaction checkpoint whose cutoff is
    at or before ``to_seq`` (what it summarizes is still the conversation); the rewind
    record itself goes too. Without a rewind, ``records`` themselves (not a copy)."""
    if not any(type(record) is RewindRecord for record in records):
        return records
    kept: list[Record] = []
    for record in records:
        if type(record) is RewindRecord:
            assert isinstance(record, RewindRecord)
            to_seq = record.to_seq
            kept = [
                r
                for r in kept
                if r.seq <= to_seq or (isinstance(r, CompactionRecord) and r.cutoff_seq <= to_seq)
            ]
        else:
            kept.append(record)
    return kept


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


# Each shape of item body, its keys once: a body is kept as its values only.
_SHAPES: Final[dict[tuple[str, ...], tuple[str, ...]]] = {}


@dataclass(frozen=True, slots=True)
class Item:
    """One replay item: its key (``seq``, ``sub``, ``part``) and its body.

    A window's items are many, and a page or a cursor needs the body or its digest of
    only a few of them: the body is kept as the values of its shape's keys, and ``body``
    and ``digest`` are made when asked for.
    """

    seq: int
    sub: int
    part: int
    keys: tuple[str, ...]
    values: tuple[object, ...]

    @classmethod
    def of(cls, seq: int, sub: int, part: int, body: dict[str, object]) -> Item:
        keys = tuple(body)
        return cls(seq, sub, part, _SHAPES.setdefault(keys, keys), tuple(body.values()))

    @property
    def body(self) -> dict[str, object]:
        return dict(zip(self.keys, self.values, strict=True))

    @property
    def kind(self) -> object:
        return self.values[self.keys.index("kind")]

    @property
    def digest(self) -> bytes:
        return _digest(self.body)


@dataclass(frozen=True, slots=True)
class Projection:
    items: list[Item]
    basis: int  # seq of the compaction checkpoint in effect, or -1
    # (seq, sub, part) -> index in ``items``: a cursor resolves without a scan
    positions: dict[tuple[int, int, int], int]
    # Where ``project`` left off, for a later projection to go on from.
    fold: _Fold = field(repr=False, compare=False)


@dataclass(slots=True)
class _Fold:
    """``project``'s state after the records it has seen."""

    cutoff: int  # of the compaction checkpoint in effect, or -1
    # Turns that settled an assistant message. Only earlier records count, so a later
    # append can never change an already projected item.
    answered: set[str]
    # The reply still streaming: (turn_id, the message's key seq, or -1 before its first
    # text). Once it has text, its last part is the last item.
    open_reply: tuple[str, int] | None
    count: int = 0
    first: Record | None = None
    last: Record | None = None


def _text_items(seq: int, head: dict[str, object], text: str, first: int = 0) -> list[Item]:
    """``text`` in parts numbered from ``first`` (the rest of a message from that part on)."""
    parts = utf8_parts(text, MAX_PART_BYTES)
    items = []
    for index, part in enumerate(parts, start=first):
        last = index == first + len(parts) - 1
        body = {**head, "text": part, "part": index, "last_part": last}
        items.append(Item.of(seq, 0, index, body))
    return items


def _digest(body: dict[str, object]) -> bytes:
    return hashlib.blake2b(orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=12).digest()


# Records that are not part of the conversation.
_OUTSIDE_CONVERSATION: Final = frozenset(
    {UnknownRecord, HeaderRecord, CompactionRecord, ApprovalRecord, RewindRecord}
)
# The head of each kind of text item.
_HEADS: Final[dict[str, dict[str, object]]] = {
    "summary": {"kind": "summary"},
    "user": {"kind": "message", "role": "user"},
    "assistant": {"kind": "message", "role": "assistant"},
}


def _items(seq: int, first: int, kind: str, text: str) -> list[Item]:
    """What ``project`` makes of a record's text: a terminal's status, or text parts."""
    if kind == "terminal":
        body: dict[str, object] = {"kind": "terminal", "status": text}
        return [Item.of(seq, 1, 0, body)]
    return _text_items(seq, _HEADS[kind], text, first)


def project(records: Sequence[Record], earlier: Projection | None = None) -> Projection:
    """The projection of ``records``.

    With ``earlier``, a projection of other records: where ``records`` begin with the very
    records (the same objects) ``earlier`` saw and add no compaction checkpoint, only the
    records after those are projected.
    """
    if any(type(record) is RewindRecord for record in records):
        # Rare (a rewound session): projected whole each time.
        records, earlier = effective(records), None
    if earlier is not None and _goes_on(earlier.fold, records):
        old = earlier.fold
        fold = _Fold(old.cutoff, set(old.answered), old.open_reply, old.count, old.first)
        items, basis, positions = earlier.items[:], earlier.basis, dict(earlier.positions)
        done = len(items)
    else:
        compaction = latest_compaction(records)
        fold = _Fold(compaction.cutoff_seq if compaction else -1, set(), None)
        items, basis, positions, done = [], compaction.seq if compaction else -1, {}, 0
        if compaction is not None:
            items += _items(compaction.seq, 0, "summary", compaction.summary)
    done = min(done, _fold(fold, records[fold.count :], items))
    for index in range(done, len(items)):
        item = items[index]
        positions[(item.seq, item.sub, item.part)] = index
    return Projection(items, basis, positions, fold)


def _goes_on(fold: _Fold, records: Sequence[Record]) -> bool:
    count = fold.count
    return (
        0 < count <= len(records)
        and records[0] is fold.first
        and records[count - 1] is fold.last
        and not any(type(record) is CompactionRecord for record in records[count:])
    )


def _fold(fold: _Fold, records: Sequence[Record], items: list[Item]) -> int:
    """Project ``records``, which follow those ``fold`` has seen, onto ``items``; the
    index of the first item that changed or was added.

    A reply persisted in increments while it streamed (``continued`` records) is one
    message, split as its whole text is: more text of the reply replaces the message's
    last part by the parts of that part's text and the new text (greedy splitting leaves
    the parts before it as they are). Its last part always has ``last_part``, so the
    message is whole in every projection, and ends as it is when the turn died mid-reply.
    """
    done = len(items)
    if not records:
        return done
    cutoff, answered, open_reply = fold.cutoff, fold.answered, fold.open_reply
    for record in records:
        kind = type(record)  # record types have no subclasses
        if kind is AssistantRecord:
            assert isinstance(record, AssistantRecord)
            answered.add(record.turn_id)
            if record.seq <= cutoff:
                continue
            message = -1
            if open_reply is not None and open_reply[0] == record.turn_id:
                message = open_reply[1]
            if record.text and message >= 0:
                last = items.pop()
                done = min(done, len(items))
                text = str(last.body["text"]) + record.text
                items += _items(message, last.part, "assistant", text)
            elif record.text:
                message = record.seq
                items += _items(message, 0, "assistant", record.text)
            # An empty record matters only to end a message.
            open_reply = (record.turn_id, message) if record.continued else None
            continue
        if record.seq <= cutoff or kind in _OUTSIDE_CONVERSATION:
            continue  # an open message stays open
        open_reply = None
        if kind is UserRecord:
            assert isinstance(record, UserRecord)
            items += _items(record.seq, 0, "user", record.text)
        elif kind is TerminalRecord:
            assert isinstance(record, TerminalRecord)
            # Accepted partial text of a stopped turn that never settled a message.
            if record.assistant_text and record.turn_id not in answered:
                items += _items(record.seq, 0, "assistant", record.assistant_text)
            items += _items(record.seq, 0, "terminal", record.status)
    fold.open_reply = open_reply
    fold.count += len(records)
    if fold.first is None:
        fold.first = records[0]
    fold.last = records[-1]
    return done


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
    return _resolve(session_id, projection.basis, projection.items, projection.positions, cursor)


def _resolve(
    session_id: str,
    basis_seq: int,
    items: Sequence[Item],
    positions: dict[tuple[int, int, int], int],
    cursor: str,
) -> int | None:
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
    if basis != basis_seq + 1:
        return None
    index = positions.get((seq, sub, part))
    if index is None:
        return None
    return index + 1 if items[index].digest == item_digest else None


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
        event = {"cursor": cursor, **item.body}  # (``body`` is made on each call)
        done = start + len(events) + 1
        candidate = _payload([*events, event], cursor, end, done < len(items), gap, False)
        if len(orjson.dumps(candidate)) > MAX_SESSION_REPLAY_PAGE_BYTES:
            break
        events.append(event)
        payload = candidate
    return payload


@dataclass(frozen=True, slots=True)
class HistoryItem:
    """A history item with its cursor and the turn it belongs to (None: a summary)."""

    cursor: str
    body: dict[str, object]
    turn_id: str | None


@dataclass(frozen=True, slots=True)
class History:
    """Every item after a cursor (``session.watch``); ``before`` is the cursor that
    precedes the first item, ``finished`` the turns with a terminal record."""

    items: list[HistoryItem]
    before: str
    finished: frozenset[str]
    gap: bool


# An approval item's ``sub``: its record is its own, so any number past a terminal's.
_APPROVAL_SUB: Final = 2


def approval_items(records: Sequence[Record], cutoff: int) -> list[tuple[Item, str]]:
    """One ``approval`` item per request recorded after ``cutoff``, with its turn: where
    it was asked (its first record), with its latest decision (``pending`` until it is
    settled). Only the v2 watch history shows them; the v1 replay's kinds are closed."""
    first: dict[str, ApprovalRecord] = {}
    latest: dict[str, ApprovalRecord] = {}
    for record in records:
        if type(record) is ApprovalRecord and record.seq > cutoff:
            assert isinstance(record, ApprovalRecord)
            first.setdefault(record.approval_id, record)
            latest[record.approval_id] = record
    out = []
    for approval_id, asked in first.items():
        now = latest[approval_id]
        body: dict[str, object] = {
            "kind": "approval",
            "turn_id": asked.turn_id,
            "approval_id": approval_id,
            "approval_kind": asked.kind,
            "subject": asked.subject,
            "decision": now.decision,
            "by": now.by,
        }
        out.append((Item.of(asked.seq, _APPROVAL_SUB, 0, body), asked.turn_id))
    return out


def history_after(
    session_id: str, records: Sequence[Record], projection: Projection, after: str | None, gap: bool
) -> History | None:
    """All items after ``after`` (None when the cursor does not match: resync): the
    replay items with the approval items (``approval_items``) where they were asked.

    A replay cursor resolves here too (its item is here, unchanged); an approval item's
    cursor only here."""
    turns: dict[int, str] = {}
    finished: set[str] = set()
    for record in records:
        if isinstance(record, UserRecord | AssistantRecord | TerminalRecord):
            turns[record.seq] = record.turn_id
        if isinstance(record, TerminalRecord):
            finished.add(record.turn_id)
    approvals = approval_items(records, projection.fold.cutoff)
    merged = _with_approvals(projection, approvals)
    items = [item for item, _ in merged]
    positions = projection.positions  # without approvals, the items are the projection's
    if approvals:
        positions = {(item.seq, item.sub, item.part): index for index, item in enumerate(items)}
    start = 0 if after is None else _resolve(session_id, projection.basis, items, positions, after)
    if start is None:
        return None
    before = (
        item_cursor(session_id, projection.basis, items[start - 1])
        if start > 0
        else start_cursor(session_id)
    )
    chosen = [
        HistoryItem(
            item_cursor(session_id, projection.basis, item),
            item.body,
            turn if turn is not None else turns.get(item.seq),
        )
        for item, turn in merged[start:]
    ]
    return History(chosen, before, frozenset(finished), gap)


def _with_approvals(
    projection: Projection, approvals: list[tuple[Item, str]]
) -> list[tuple[Item, str | None]]:
    """The projection's items with ``approvals`` (in record order) among them: each
    before the first item from a later record. A summary stays first (its key is its
    checkpoint's, later than the records after the cutoff that follow it)."""
    merged: list[tuple[Item, str | None]] = []
    pending = iter(approvals)
    waiting = next(pending, None)
    for index, item in enumerate(projection.items):
        summary = index == 0 and projection.basis >= 0
        while waiting is not None and not summary and waiting[0].seq < item.seq:
            merged.append(waiting)
            waiting = next(pending, None)
        merged.append((item, None))
    if waiting is not None:
        merged.append(waiting)
        merged.extend(pending)
    return merged


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
