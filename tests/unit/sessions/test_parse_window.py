"""``parse_window``: where its records start, what it skips, and what a parse holds."""

from __future__ import annotations

import tracemalloc

import pytest

from magi_code.sessions import projection
from magi_code.sessions.projection import parse_window
from magi_code.sessions.records import ToolCallRecord, ToolResultRecord, encode_record

SESSION = "sess_0123456789abcdef01234567"
TS = "2026-01-01T00:00:00.000Z"
HEADER = encode_record({"type": "header", "session_id": SESSION, "created_at": TS}, 0, TS)


def turn(seq: int, turn_id: str, text: str = "a reply") -> list[bytes]:
    """One tool turn's five lines, from ``seq`` on."""
    call = {"turn_id": turn_id, "call_id": f"call_{turn_id}", "name": "read_file"}
    fields: list[dict[str, object]] = [
        {"type": "user", "turn_id": turn_id, "text": "a prompt"},
        {"type": "tool_call", **call, "arguments": "{}"},
        {"type": "tool_result", **call, "output": "contents", "is_error": False},
        {"type": "assistant", "turn_id": turn_id, "text": text},
        {"type": "terminal", "turn_id": turn_id, "status": "completed", "assistant_text": text},
    ]
    return [encode_record(record, seq + n, TS) for n, record in enumerate(fields)]


def test_records_start_where_their_lines_do() -> None:
    lines = [HEADER, *turn(1, "turn_a"), *turn(6, "turn_b")]
    window = parse_window(b"".join(lines), 0, SESSION)
    assert [record.seq for record in window.records] == list(range(11))
    assert list(window.starts) == [sum(map(len, lines[:n])) for n in range(11)]
    assert window.end == sum(map(len, lines))
    assert window.last_line == lines[-1][:-1]
    assert not window.gap and not window.omitted_prefix


def test_a_window_inside_the_file_skips_its_partial_first_line() -> None:
    lines = [HEADER, *turn(1, "turn_a")]
    data = b"".join(lines)
    cut = len(HEADER) + 10  # inside the user record's line
    window = parse_window(data[cut:], cut, SESSION)
    assert [record.seq for record in window.records] == [2, 3, 4, 5]
    assert window.starts[0] == sum(map(len, lines[:2]))
    assert window.omitted_prefix and not window.gap


def test_a_torn_tail_is_a_gap_and_the_lines_before_it_stay() -> None:
    lines = [HEADER, *turn(1, "turn_a")]
    data = b"".join(lines) + lines[1][:7]
    window = parse_window(data, 0, SESSION)
    assert [record.seq for record in window.records] == list(range(6))
    assert window.gap
    assert window.end == len(data)


def test_past_the_record_bound_only_the_newest_lines_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(projection, "MAX_WINDOW_RECORDS", 3)
    lines = [HEADER, *turn(1, "turn_a")]
    window = parse_window(b"".join(lines), 0, SESSION)
    assert [record.seq for record in window.records] == [3, 4, 5]
    assert window.starts[0] == sum(map(len, lines[:3]))
    assert window.omitted_prefix


def test_a_turns_records_share_its_strings() -> None:
    """Each of a turn's records names its turn, a call's two records its ID and tool,
    and the terminal repeats the reply: decoded from one window each is one string."""
    window = parse_window(b"".join([HEADER, *turn(1, "turn_a"), *turn(6, "turn_b")]), 0, SESSION)
    first = window.records[1:6]
    assert len({id(record.turn_id) for record in first}) == 1  # type: ignore[attr-defined]
    call, result = first[1], first[2]
    assert isinstance(call, ToolCallRecord) and isinstance(result, ToolResultRecord)
    assert call.call_id is result.call_id and call.name is result.name
    assert first[3].text is first[4].assistant_text  # type: ignore[attr-defined]
    assert window.records[6].turn_id is not first[0].turn_id  # type: ignore[attr-defined]


def test_a_parse_holds_little_besides_what_it_returns() -> None:
    """The lines are decoded one at a time: a parse's peak is its window's bytes and the
    records it returns, not also every line of the window as an object of its own."""
    data = b"".join([HEADER, *(line for n in range(400) for line in turn(1 + 5 * n, f"t{n}"))])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        window = parse_window(data, 0, SESSION)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(window.records) == 2001
    # Splitting the window first would add about its own size again.
    assert peak - held < len(data) // 4, (peak - before, held - before, len(data))
