"""Property: paging through replay yields exactly the projection (spec: each message's
whole text in parts <= 2,048 bytes, a streamed reply's increments joined; pages <= limit
items and <= 16 KiB; cursors continue across appends, except that one naming the last
part of a reply the append went on with needs a resync, and only that one); a window
extended by appended bytes and a projection continued from an earlier one equal a whole
parse and a whole projection."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from magi_code.protocol.limits import MAX_SESSION_REPLAY_PAGE_BYTES
from magi_code.sessions.projection import extend_window, parse_window, project
from magi_code.sessions.records import encode_record
from magi_code.sessions.store import HISTORY, SessionStore

TS = "2025-01-01T00:00:00.000Z"
SESSION = "ses_01m9063t8key6vbkjmrb717ykx"

texts = st.builds(
    lambda unit, times: unit * times,
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.integers(min_value=0, max_value=500),
)
turn_ids = st.sampled_from(["t1", "t2", "t3"])
ops = st.one_of(
    st.tuples(st.just("user"), turn_ids, texts),
    st.tuples(st.just("assistant"), turn_ids, texts),
    st.tuples(st.just("increment"), turn_ids, texts),  # a streaming reply's continued record
    st.tuples(
        st.just("terminal"),
        turn_ids,
        texts,
        st.sampled_from(["completed", "cancelled", "failed", "compaction_required"]),
    ),
    st.tuples(st.just("tool_call"), turn_ids),
    st.tuples(st.just("compaction"), texts, st.floats(min_value=0, max_value=1)),
    st.tuples(st.just("unknown")),
)


def to_fields(op: tuple[object, ...], seq: int) -> dict[str, object] | None:
    match op:
        case ("user" | "assistant", turn_id, text):
            return {"type": op[0], "turn_id": turn_id, "text": text}
        case ("increment", turn_id, text):
            return {"type": "assistant", "turn_id": turn_id, "text": text, "continued": True}
        case ("terminal", turn_id, text, status):
            return {
                "type": "terminal",
                "turn_id": turn_id,
                "status": status,
                "assistant_text": text,
            }
        case ("tool_call", turn_id):
            return {
                "type": "tool_call",
                "turn_id": turn_id,
                "call_id": "c",
                "name": "n",
                "arguments": "{}",
            }
        case ("compaction", text, where):
            assert isinstance(where, float)
            return {"type": "compaction", "summary": text, "cutoff_seq": int(where * (seq - 1))}
    return None


def write(
    path: Path, op_list: list[tuple[object, ...]], first_seq: int
) -> tuple[int, list[dict[str, object]]]:
    records = []
    with path.open("ab") as fh:
        seq = first_seq
        for op in op_list:
            fields = to_fields(op, seq)
            if fields is None:
                fh.write(orjson.dumps({"v": 1, "seq": seq, "ts": TS, "type": "future"}) + b"\n")
            else:
                fh.write(encode_record(fields, seq, TS))
                records.append({**fields, "seq": seq})
            seq += 1
    return seq, records


def reference_parts(text: str) -> list[str]:
    parts, current = [], ""
    for ch in text:
        if len((current + ch).encode()) > 2048:
            parts.append(current)
            current = ""
        current += ch
    return [*parts, current] if current or not parts else parts


def expected(records: list[dict[str, object]]) -> list[dict[str, object]]:
    compactions = [r for r in records if r["type"] == "compaction"]
    # (head, text) of each item group in order; a terminal status is one group of its own.
    groups: list[list[object]] = []
    cutoff = -1
    if compactions:
        groups.append([{"kind": "summary"}, compactions[-1]["summary"]])
        cutoff = int(str(compactions[-1]["cutoff_seq"]))
    answered = set()
    # (turn_id, its message's group or None before any text) of a reply still streaming.
    reply: tuple[object, int | None] | None = None
    for r in records:
        if r["type"] == "assistant":
            answered.add(r["turn_id"])
        if int(str(r["seq"])) <= cutoff:
            continue
        if r["type"] == "assistant":
            group = reply[1] if reply is not None and reply[0] == r["turn_id"] else None
            if r["text"] and group is None:
                groups.append([{"kind": "message", "role": "assistant"}, r["text"]])
                group = len(groups) - 1
            elif r["text"]:
                assert group is not None
                groups[group][1] = str(groups[group][1]) + str(r["text"])
            reply = (r["turn_id"], group) if r.get("continued") else None
            continue
        if r["type"] == "compaction":
            continue  # not part of the conversation: an open message stays open
        reply = None
        if r["type"] == "user":
            groups.append([{"kind": "message", "role": "user"}, r["text"]])
        elif r["type"] == "terminal":
            if r["assistant_text"] and r["turn_id"] not in answered:
                groups.append([{"kind": "message", "role": "assistant"}, r["assistant_text"]])
            groups.append([{"kind": "terminal", "status": r["status"]}, None])
    out: list[dict[str, object]] = []
    for head, text in groups:
        assert isinstance(head, dict)
        if text is None:
            out.append(head)
            continue
        parts = reference_parts(str(text))
        for i, part in enumerate(parts):
            out.append({**head, "text": part, "part": i, "last_part": i == len(parts) - 1})
    return out


@settings(max_examples=60)
# A reply still streaming when the first pass ends, whose last part the append extends.
@example(
    before=[("user", "t1", "q"), ("increment", "t1", "é" * 1100)],
    later=[("increment", "t1", "x" * 10), ("assistant", "t1", "")],
    limits=[1, 32],
)
@given(
    before=st.lists(ops, max_size=12),
    later=st.lists(ops.filter(lambda op: op[0] != "compaction"), max_size=6),
    limits=st.lists(st.integers(min_value=1, max_value=32), min_size=1, max_size=8),
)
def test_concatenated_pages_equal_the_projection(
    before: list[tuple[object, ...]],
    later: list[tuple[object, ...]],
    limits: list[int],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SessionStore(Path(tmp))
        session = store.create()
        path = Path(tmp) / session / HISTORY
        next_seq, records = write(path, before, 1)
        events: list[dict[str, object]] = []
        cursors: set[str] = set()
        after = None
        appended = resynced = False
        stale = False  # the append changed an item accepted before it
        for page_index in range(100_000):
            page = store.replay(session, after, limits[page_index % len(limits)])
            encoded = orjson.dumps(page)
            assert len(encoded) <= MAX_SESSION_REPLAY_PAGE_BYTES
            assert page["gap"] is False
            if page["resync_required"]:
                # Only once, right after an append that changed what was accepted.
                assert stale and not resynced and not page["events"]
                resynced = True
                events, cursors, after = [], set(), page["next_cursor"]
                continue
            assert len(page["events"]) <= limits[page_index % len(limits)]
            for event in page["events"]:
                cursor = event.pop("cursor")
                assert isinstance(cursor, str) and len(cursor) <= 128 and cursor not in cursors
                cursors.add(cursor)
                events.append(event)
                assert len(str(event.get("text", "")).encode()) <= 2048
            if page["events"]:
                assert page["next_cursor"] == cursor
            after = page["next_cursor"]
            if not page["truncated"]:
                assert page["next_cursor"] == page["snapshot_cursor"]
                if appended:
                    break
                # New durable records after the first pass continue from the saved cursor,
                # unless they changed the last item accepted: the last part of a reply
                # still streaming, which more of its text extends or ends.
                assert events == expected(records)
                next_seq, more = write(path, later, next_seq)
                records += more
                appended = True
                now = expected(records)
                stale = events != now[: len(events)]
                if stale:
                    assert events[:-1] == now[: len(events) - 1]
                    assert events[-1]["kind"] == "message" and events[-1]["role"] == "assistant"
        assert resynced == stale
        assert events == expected(records)


def history(op_list: list[tuple[object, ...]]) -> bytes:
    lines = [encode_record({"type": "header", "session_id": SESSION, "created_at": TS}, 0, TS)]
    for seq, op in enumerate(op_list, start=1):
        fields = to_fields(op, seq)
        lines.append(
            encode_record(fields, seq, TS)
            if fields is not None
            else b'{"v":1,"seq":%d,"ts":"%s","type":"future"}\n' % (seq, TS.encode())
        )
    return b"".join(lines)


@given(
    before=st.lists(ops, max_size=10),
    later=st.lists(ops, max_size=8),
    first_cut=st.floats(min_value=0, max_value=1),
    second_cut=st.floats(min_value=0, max_value=1),
)
def test_extended_window_and_projection_equal_a_whole_parse(
    before: list[tuple[object, ...]],
    later: list[tuple[object, ...]],
    first_cut: float,
    second_cut: float,
) -> None:
    old = history(before)
    new = history(before + later)
    assert new.startswith(old)
    # Windows start anywhere: the second never before the first, as a growing file's.
    first = int(first_cut * len(old))
    second = first + int(second_cut * (len(new) - first))
    earlier = parse_window(old[first:], first, SESSION)
    whole = parse_window(new[second:], second, SESSION)
    extended = extend_window(earlier, new[len(old) :], second)
    if extended is not None:
        assert extended == whole
    else:  # only where a whole parse is needed: a gap, nothing to go on from or to add
        assert earlier.gap or not earlier.records or not later
    window = extended or whole
    earlier_projection = project(earlier.records)
    continued = project(window.records, earlier_projection)
    fresh = project(window.records)
    assert (continued.items, continued.basis, continued.positions) == (
        fresh.items,
        fresh.basis,
        fresh.positions,
    )
