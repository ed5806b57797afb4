"""Conversation context helpers: rebuilding from records whose start was cut off, the
user-first rule, the estimate behind the threshold, and the bounded summary transcript."""

from __future__ import annotations

import random

from magi_code.providers.types import AssistantText, ToolCall, ToolResult, UserText
from magi_code.sessions.records import (
    AssistantRecord,
    TerminalRecord,
    ToolCallRecord,
    ToolResultRecord,
    UserRecord,
)
from magi_code.turns.context import (
    EARLIER_NOTE,
    MAX_TRANSCRIPT_PART_BYTES,
    MIN_SUMMARY_INPUT_BYTES,
    GrowingEstimate,
    estimate_tokens,
    items_from_records,
    leading_user,
    needs_compaction,
    summary_budget,
    transcript,
)


def test_a_result_whose_call_is_before_the_window_is_left_out() -> None:
    records = [
        ToolResultRecord(10, "t1", "c-early", "read_file", "early output", False),
        AssistantRecord(11, "t1", "done"),
        TerminalRecord(12, "t1", "completed", "done"),
        UserRecord(13, "t2", "next"),
        ToolCallRecord(14, "t2", "c2", "shell", "{}"),
        ToolResultRecord(15, "t2", "c2", "shell", "ok", False),
    ]
    assert items_from_records(records) == [
        AssistantText("done"),
        UserText("next"),
        ToolCall("c2", "shell", "{}"),
        ToolResult("c2", "shell", "ok", False),
    ]


def test_a_continued_reply_is_one_message_and_an_empty_marker_adds_nothing() -> None:
    records = [
        UserRecord(1, "t1", "go"),
        AssistantRecord(2, "t1", "part one ", continued=True),
        AssistantRecord(3, "t1", "part two"),
        AssistantRecord(4, "t1", "", truncated=True),
        UserRecord(5, "t2", "again"),
        AssistantRecord(6, "t2", "", truncated=True),
    ]
    assert items_from_records(records) == [
        UserText("go"),
        AssistantText("part one part two"),
        UserText("again"),
    ]


def test_a_conversation_is_led_by_the_user() -> None:
    resumed = [AssistantText("worked"), UserText("next")]
    assert leading_user(resumed) == [UserText(EARLIER_NOTE), *resumed]
    assert leading_user([UserText("hi")]) == [UserText("hi")]
    assert leading_user([]) == []


def test_the_estimate_and_the_threshold() -> None:
    assert estimate_tokens("s" * 40, [UserText("u" * 24)]) == (40 + 24 + 16) // 4
    assert not needs_compaction(799, 1000)
    assert needs_compaction(800, 1000)
    assert not needs_compaction(10**9, 0)  # an unknown window never compacts


def test_the_growing_estimate_is_the_estimate_through_growth_and_compaction() -> None:
    rng = random.Random(7)
    growing = GrowingEstimate()
    items: list[ToolCall | ToolResult | UserText | AssistantText] = [UserText("start")]
    system = "system"
    for step in range(400):
        action = rng.random()
        if action < 0.7:
            n = rng.randrange(3)
            items += [
                ToolResult(f"c{step}-{i}", "t", "é" * rng.randrange(50), False) for i in range(n)
            ]
        elif action < 0.8:
            items[:] = items[rng.randrange(len(items)) :]  # a compaction keeps a tail
        elif action < 0.85:
            items[:] = [UserText("resume")]  # or replaces it all
        elif action < 0.9:
            # A tail replaced by as many new items: the last counted one is gone.
            items[-1:] = [AssistantText("other")]
        else:
            system = "system with a summary " * rng.randrange(4)
        assert growing.tokens(system, items) == estimate_tokens(system, items), step


def test_the_transcript_keeps_the_newest_part_within_its_budget() -> None:
    items = [
        UserText("first request"),
        ToolCall("c1", "shell", '{"command": "ls"}'),
        ToolResult("c1", "shell", "x" * (3 * MAX_TRANSCRIPT_PART_BYTES), False),
        ToolResult("c2", "grep", "no such pattern", True),
        AssistantText("the newest answer"),
    ]
    whole = transcript(items, 10**6)
    assert whole.startswith("[user]\nfirst request\n\n[tool call: shell]\n")
    assert "[tool error: grep]\nno such pattern" in whole
    assert len(whole.encode()) < 2 * MAX_TRANSCRIPT_PART_BYTES  # the long result clipped
    cut = transcript(items, 4096)
    assert len(cut.encode()) <= 4096
    assert cut.endswith("[assistant]\nthe newest answer")
    assert cut.startswith("[... the earlier part of the conversation is omitted ...]")
    assert "first request" not in cut


def test_the_summary_budget_is_half_the_window_with_a_floor() -> None:
    assert summary_budget(200_000) == 100_000 * 4
    assert summary_budget(300) == MIN_SUMMARY_INPUT_BYTES
