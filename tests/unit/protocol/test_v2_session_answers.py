"""The answers to a session's transcript (RFC-0002 §6.14) and selection (§6.15) as a
persistent client reads them: typed values, and a frame that does not fit its type is
malformed (the client ends the connection with ``protocol_error``)."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import (
    AnswerFrame,
    CallFailed,
    Malformed,
    SelectionResult,
    TranscriptResult,
    decode_persistent_frame,
)

MESSAGE = {"kind": "message", "role": "user", "text": "hi"}
CALL = {
    "kind": "tool_call",
    "turn_id": "t1",
    "call_id": "c1",
    "call": {
        "tool": "read_file",
        "arguments": {"path": "a.py"},
        "truncated": False,
        "locations": [{"path": "a.py"}],
    },
    "status": "no_result",
}
TERMINAL = {"kind": "terminal", "turn_id": "t1", "status": "cancelled"}


def test_a_transcript_page_is_read() -> None:
    frame = {
        "t": "transcript_result",
        "id": 4,
        "items": [MESSAGE, CALL, TERMINAL],
        "next_cursor": "3",
        "gap": True,
    }
    assert decode_persistent_frame(frame) == AnswerFrame(
        "transcript_result", 4, TranscriptResult([MESSAGE, CALL, TERMINAL], "3", True)
    )
    last = {"t": "transcript_result", "id": 5, "items": [], "next_cursor": None, "gap": False}
    assert decode_persistent_frame(last) == AnswerFrame(
        "transcript_result", 5, TranscriptResult([], None, False)
    )
    failed = {"t": "session_error", "id": 6, "code": "session_busy"}
    assert decode_persistent_frame(failed) == AnswerFrame(
        "session_error", 6, CallFailed("session_busy")
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"items": None},
        {"items": [MESSAGE, "text"]},
        {"items": [{"role": "user", "text": "no kind"}]},
        {"items": [{**CALL, "status": "lost"}]},
        {"items": [{**CALL, "call_id": 7}]},
        {"items": [{k: v for k, v in CALL.items() if k != "turn_id"}]},
        {"items": [{**CALL, "call": "read_file"}]},
        {"items": [{**CALL, "call": {"tool": "read_file", "arguments": {}}}]},
        {"items": [{**CALL, "call": {**CALL["call"], "arguments": []}}]},
        {"next_cursor": 3},
        {"gap": None},
    ],
)
def test_a_transcript_page_that_does_not_fit_is_malformed(fields: dict[str, Any]) -> None:
    frame = {"t": "transcript_result", "id": 4, "items": [], "next_cursor": None, "gap": False}
    with pytest.raises(Malformed):
        decode_persistent_frame({**frame, **fields})


EFFECTIVE = {
    "provider_id": "local",
    "model_id": "m2",
    "thinking_level": "high",
    "available_thinking_levels": ["default", "high"],
}


def test_a_selection_answer_is_read() -> None:
    frame = {"t": "session_selection_result", "id": 7, "session_id": "s1", "effective": EFFECTIVE}
    assert decode_persistent_frame(frame) == AnswerFrame(
        "session_selection_result", 7, SelectionResult("s1", EFFECTIVE)
    )
    failed = {"t": "session_selection_error", "id": 8, "code": "unsupported_reasoning"}
    assert decode_persistent_frame(failed) == AnswerFrame(
        "session_selection_error", 8, CallFailed("unsupported_reasoning")
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"effective": None},
        {"session_id": None},
        {"effective": {**EFFECTIVE, "model_id": None}},
        {"effective": {k: v for k, v in EFFECTIVE.items() if k != "thinking_level"}},
        {"effective": {**EFFECTIVE, "available_thinking_levels": "high"}},
        {"effective": {**EFFECTIVE, "available_thinking_levels": [1]}},
    ],
)
def test_a_selection_answer_that_does_not_fit_is_malformed(fields: dict[str, Any]) -> None:
    frame = {"t": "session_selection_result", "id": 7, "session_id": "s1", "effective": EFFECTIVE}
    with pytest.raises(Malformed):
        decode_persistent_frame({**frame, **fields})
