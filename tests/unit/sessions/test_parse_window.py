"""``parse_window``: where its records start, what it skips, what they share."""

from __future__ import annotations

import pytest
from window_lines import HEADER, SESSION, turn

from magi_code.sessions import projection
from magi_code.sessions.projection import parse_window
from magi_code.sessions.records import ToolCallRecord, ToolResultRecord


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
