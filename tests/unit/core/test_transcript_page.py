"""A ``transcript_result`` page (RFC-0002 §6.14): the conversation's items with each tool
call where it happened, bounded in bytes, continued by its cursor without loss or repeat;
and the ``session_transcript`` frame's arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.core.persistent import transcript_page
from magi_code.protocol.v2 import (
    MAX_TRANSCRIPT_PAGE_BYTES,
    Rejected,
    SessionTranscript,
    decode,
)
from magi_code.sessions.projection import Item
from magi_code.sessions.records import ToolCallRecord, ToolResultRecord
from magi_code.sessions.store import Transcript


def _message(seq: int, role: str, text: str) -> Item:
    body = {"kind": "message", "role": role, "text": text, "part": 0, "last_part": True}
    return Item.of(seq, 0, 0, body)


def _transcript(turns: int, text: str) -> Transcript:
    items, records = [], []
    for turn in range(turns):
        seq = turn * 10
        items.append(_message(seq + 1, "user", f"q{turn} {text}"))
        records.append(ToolCallRecord(seq + 2, f"t{turn}", "c1", "read_file", '{"path": "a.py"}'))
        if turn % 2 == 0:  # odd turns' calls have no result
            records.append(ToolResultRecord(seq + 3, f"t{turn}", "c1", "read_file", "x", False))
        items.append(_message(seq + 4, "assistant", f"a{turn}"))
    return Transcript(tuple(items), tuple(records), False)


def _all_pages(transcript: Transcript, project: Path) -> list[list[dict[str, Any]]]:
    pages, start = [], 0
    while True:
        page = transcript_page(transcript, start, project)
        pages.append(page["items"])
        assert len(orjson.dumps(page["items"])) <= MAX_TRANSCRIPT_PAGE_BYTES + 1024
        if page["next_cursor"] is None:
            return pages
        start = int(page["next_cursor"])


def test_tool_calls_come_where_they_happened(tmp_path: Path) -> None:
    (page,) = _all_pages(_transcript(2, "hi"), tmp_path)
    kinds = [(i["kind"], i.get("role"), i.get("status")) for i in page]
    assert kinds == [
        ("message", "user", None),
        ("tool_call", None, "completed"),
        ("message", "assistant", None),
        ("message", "user", None),
        ("tool_call", None, "no_result"),
        ("message", "assistant", None),
    ]
    call = page[1]
    assert call["turn_id"] == "t0" and call["call_id"] == "c1"
    assert call["call"] == {
        "tool": "read_file",
        "arguments": {"path": "a.py"},
        "truncated": False,
        "locations": [{"path": "a.py"}],
    }


def test_pages_are_bounded_and_continue_without_loss(tmp_path: Path) -> None:
    transcript = _transcript(300, "x" * 2000)
    pages = _all_pages(transcript, tmp_path)
    assert len(pages) > 1
    joined = [item for page in pages for item in page]
    assert len(joined) == 300 * 3
    asked = [i["text"].split()[0] for i in joined if i.get("role") == "user"]
    assert asked == [f"q{turn}" for turn in range(300)]
    assert [i["kind"] for i in joined[:3]] == ["message", "tool_call", "message"]


def test_the_frame_is_read() -> None:
    frame = {"t": "session_transcript", "id": 4, "session_id": "ses_1", "cursor": "12"}
    assert decode(frame, "persistent") == SessionTranscript(4, "ses_1", 12)
    assert decode({**frame, "cursor": None}, "persistent") == SessionTranscript(4, "ses_1", 0)


@pytest.mark.parametrize(
    "fields",
    [{}, {"session_id": 1}, {"session_id": "s", "cursor": "-1"}, {"session_id": "s", "cursor": 3}],
)
def test_bad_arguments_are_invalid_request(fields: dict[str, Any]) -> None:
    with pytest.raises(Rejected) as rejected:
        decode({"t": "session_transcript", "id": 9, **fields}, "persistent")
    assert rejected.value.answer == {"t": "session_error", "id": 9, "code": "invalid_request"}
