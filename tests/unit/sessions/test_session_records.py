"""Record codec, text splitting and title sanitizing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from magi_code.protocol.text import utf8_parts
from magi_code.sessions import records
from magi_code.sessions.records import (
    CompactionRecord,
    TerminalRecord,
    UnknownRecord,
    UserRecord,
    decode_line,
    encode_record,
    now_rfc3339,
)
from magi_code.sessions.titles import MAX_TITLE_CHARS, sanitize_title, title_from_prompt

TS = "2025-01-01T00:00:00.000Z"


def test_encoded_record_is_one_compact_versioned_line() -> None:
    line = encode_record({"type": "user", "turn_id": "t", "text": "a\nb"}, 3, TS)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert orjson.loads(line) == {
        "v": 1,
        "seq": 3,
        "ts": TS,
        "type": "user",
        "turn_id": "t",
        "text": "a\nb",
    }
    assert decode_line(line[:-1]) == UserRecord(3, "t", "a\nb")


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "nope"},
        {"type": "user", "turn_id": "t"},
        {"type": "user", "turn_id": "t", "text": 1},
        {"type": "user", "turn_id": "t", "text": "x", "seq": 9},
        {"type": "terminal", "turn_id": "t", "status": "weird", "assistant_text": ""},
        {"type": "compaction", "summary": "s", "cutoff_seq": 5},  # cutoff not before seq 5
        {"type": "compaction", "summary": "s", "cutoff_seq": True},
        {
            "type": "tool_result",
            "turn_id": "t",
            "call_id": "c",
            "name": "n",
            "output": "o",
            "is_error": 0,
        },
        {"type": "user", "turn_id": "t", "text": "\ud800"},
    ],
)
def test_invalid_records_are_refused_on_write(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        encode_record(fields, 5, TS)


def test_decoder_skips_malformed_and_keeps_unknown_types() -> None:
    good = encode_record({"type": "compaction", "summary": "s", "cutoff_seq": 2}, 4, TS)[:-1]
    assert decode_line(good) == CompactionRecord(4, "s", 2)
    assert decode_line(b'{"v":1,"seq":7,"ts":"x","type":"future_kind","x":1}') == UnknownRecord(
        7, "future_kind"
    )
    for bad in [
        b"",
        b"{",
        b"[]",
        b'{"v":2,"seq":1,"type":"user","turn_id":"t","text":"x"}',
        b'{"v":true,"seq":1,"type":"user","turn_id":"t","text":"x"}',
        b'{"v":1,"seq":-1,"type":"user","turn_id":"t","text":"x"}',
        b'{"v":1,"seq":1.0,"type":"user","turn_id":"t","text":"x"}',
        b'{"v":1,"seq":1,"type":"user","turn_id":"t"}',
        b'{"v":1,"seq":1,"type":"user","turn_id":"t","text":"\\ud800"}',
    ]:
        assert decode_line(bad) is None, bad
    terminal = encode_record(
        {"type": "terminal", "turn_id": "t", "status": "failed", "assistant_text": "p"}, 2, TS
    )
    assert decode_line(terminal[:-1]) == TerminalRecord(2, "t", "failed", "p")


@pytest.mark.parametrize(
    "text", ["", "a", "a" * 2048, "a" * 2049, "é" * 1500, "😀" * 1000, "a" + "😀" * 600]
)
def test_text_parts_split_on_utf8_boundaries_within_2048_bytes(text: str) -> None:
    parts = utf8_parts(text, 2048)
    assert "".join(parts) == text
    assert all(len(p.encode()) <= 2048 for p in parts)
    assert all(p for p in parts) or parts == [""]


def test_titles_are_sanitized_bounded_and_redacted() -> None:
    assert (
        title_from_prompt("\n  \n  Fix the\tbug\x1b[31m now\nsecond line") == "Fix the bug[31m now"
    )
    assert sanitize_title("a\u202eb\u200bc") == "abc"
    long = sanitize_title("word " * 100)
    assert long is not None and len(long) <= MAX_TITLE_CHARS
    redacted = sanitize_title("use key sk-ant-abcdefghijklmnop123 please")
    assert redacted == "use key [redacted] please"
    assert sanitize_title("Authorization: Bearer abc.def") == "Authorization: [redacted]"
    assert sanitize_title("\x00\x07") is None
    assert sanitize_title(42) is None


def test_a_records_time_is_now_in_utc_to_the_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1_700_000_000_999_999_999, 1_700_000_000_000_000_000, 1_700_000_001_000_500_000])
    monkeypatch.setattr(records.time, "time_ns", lambda: next(clock))
    assert [now_rfc3339() for _ in range(3)] == [
        "2023-11-14T22:13:20.999Z",
        "2023-11-14T22:13:20.000Z",
        "2023-11-14T22:13:21.000Z",  # the next second is formatted anew
    ]
    real = datetime.now(UTC)
    monkeypatch.undo()
    assert abs(datetime.fromisoformat(now_rfc3339()) - real) < timedelta(seconds=5)
