"""Approval records in the projection (pure): v1 replay pages never show them and are the
same as without them; the v2 watch history (``history_after``) shows one item per request
where it was asked, with its latest decision, after a compaction summary, and resolves
replay cursors and its own."""

from __future__ import annotations

from typing import Any

from magi_code.sessions.projection import build_page, history_after, parse_window, project
from magi_code.sessions.records import ApprovalRecord, decode_line, encode_record

SESSION = "ses_1"
TS = "2025-01-01T00:00:00.000Z"


def _history(records: list[dict[str, Any]]) -> bytes:
    lines = [encode_record({"type": "header", "session_id": SESSION, "created_at": TS}, 0, TS)]
    lines += [encode_record(fields, seq, TS) for seq, fields in enumerate(records, start=1)]
    return b"".join(lines)


def _approval(approval_id: str, decision: str, by: str | None = None) -> dict[str, Any]:
    return {
        "type": "approval",
        "turn_id": "t1",
        "approval_id": approval_id,
        "kind": "command",
        "decision": decision,
        "subject": "make test",
        "by": by,
    }


USER = {"type": "user", "turn_id": "t1", "text": "go"}
CALL = {"type": "tool_call", "turn_id": "t1", "call_id": "c", "name": "shell", "arguments": "{}"}
RESULT = {
    "type": "tool_result",
    "turn_id": "t1",
    "call_id": "c",
    "name": "shell",
    "output": "ok",
    "is_error": False,
}
REPLY = {"type": "assistant", "turn_id": "t1", "text": "done"}
END = {"type": "terminal", "turn_id": "t1", "status": "completed", "assistant_text": "done"}
WITH_APPROVALS = [
    USER,
    CALL,
    _approval("a1", "pending"),
    _approval("a1", "allow_once", "ed#1"),
    RESULT,
    _approval("a2", "pending"),  # never settled
    REPLY,
    END,
]


def _window(records: list[dict[str, Any]]) -> Any:
    return parse_window(_history(records), 0, SESSION)


def test_an_approval_record_decodes_with_its_fields() -> None:
    line = encode_record(_approval("a1", "allow_once", "ed#1"), 4, TS)
    assert decode_line(line[:-1]) == ApprovalRecord(
        4, "t1", "a1", "command", "allow_once", "make test", "ed#1"
    )


def test_v1_pages_are_the_same_as_without_approvals() -> None:
    plain = [r for r in WITH_APPROVALS if r["type"] != "approval"]
    pages = []
    for records in (WITH_APPROVALS, plain):
        window = _window(records)
        page = build_page(SESSION, project(window.records), None, 32, window.gap)
        pages.append([{k: v for k, v in e.items() if k != "cursor"} for e in page["events"]])
    assert pages[0] == pages[1]
    assert {e["kind"] for e in pages[0]} == {"message", "terminal"}


def test_the_watch_history_shows_each_request_where_it_was_asked() -> None:
    window = _window(WITH_APPROVALS)
    projection = project(window.records)
    history = history_after(SESSION, window.records, projection, None, False)
    assert history is not None
    shown = [
        (i.body["kind"], i.body.get("decision"), i.body.get("by"), i.turn_id) for i in history.items
    ]
    assert shown == [
        ("message", None, None, "t1"),
        ("approval", "allow_once", "ed#1", "t1"),
        ("approval", "pending", None, "t1"),
        ("message", None, None, "t1"),
        ("terminal", None, None, "t1"),
    ]
    # A replay cursor resolves here, and so does an approval item's.
    page = build_page(SESSION, projection, None, 1, False)
    after_user = history_after(SESSION, window.records, projection, page["next_cursor"], False)
    assert after_user is not None and after_user.items == history.items[1:]
    after_first = history_after(SESSION, window.records, projection, history.items[1].cursor, False)
    assert after_first is not None and after_first.items == history.items[2:]
    assert after_first.before == history.items[1].cursor


def test_a_settled_request_makes_its_pending_items_cursor_stale() -> None:
    asked = WITH_APPROVALS[:3]
    window = _window(asked)
    history = history_after(SESSION, window.records, project(window.records), None, False)
    assert history is not None
    cursor = history.items[-1].cursor
    window = _window(WITH_APPROVALS[:4])
    assert history_after(SESSION, window.records, project(window.records), cursor, False) is None


def test_after_a_compaction_the_summary_comes_first_and_earlier_approvals_are_gone() -> None:
    compaction = {"type": "compaction", "summary": "so far", "cutoff_seq": 4}
    window = _window([*WITH_APPROVALS, compaction, USER, _approval("a3", "reject", "ed#2")])
    history = history_after(SESSION, window.records, project(window.records), None, False)
    assert history is not None
    assert [(i.body["kind"], i.body.get("approval_id")) for i in history.items] == [
        ("summary", None),
        ("approval", "a2"),
        ("message", None),
        ("terminal", None),
        ("message", None),
        ("approval", "a3"),
    ]
