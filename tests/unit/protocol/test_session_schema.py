"""The v2 watch, hand-over, steer, library and queue frames' JSON Schemas
(``protocol.schema.session``): valid 2020-12 documents, shipped (``test_schema``
regenerates them), holding the frames the daemon's builders and stores make and the
client frames the daemon's decoder accepts, while refusing what the RFC does not allow —
a client frame the schema refuses, the decoder refuses too."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.core.approvals import _requested
from magi_code.protocol import v2
from magi_code.protocol.schema import SHIPPED, shipped_documents
from magi_code.protocol.schema.session import BUNDLES, EVENTS, FRAMES, GROUPS, documents
from magi_code.sessions.listing import library_item
from magi_code.sessions.queue import MAX_QUEUE_ENTRIES, QueueEntry
from tests.support import wire_schema

SESSION = "ses_01m926rh87851zcf2e5wprj68d"
APPROVAL_ID = "appr_0123456789abcdef01234567"
CURSOR = "AR6ccy7SJc_6AQAAAAAAAAAAAAAAAAAAAAEAAAAAAOajqZV3u71R-XP6og"
ENTRY = QueueEntry("q_0123456789abcdef", "then run the tests", "editor#2", "2026-12-05T04:00:00Z")
ITEM = library_item(
    SESSION,
    {"title": "Fix the parser", "project_dir": "/p", "archived": True, "forks": ["ses_2"]},
    1_700_000_000_000_000_000,
)


def test_every_document_is_a_valid_schema_and_shipped() -> None:
    docs = documents()
    bundles = {f"v2.{group}" for group in GROUPS}
    assert set(docs) == {f"v2.{kind}" for kind in FRAMES} | {"v2.watch_event"} | bundles
    for name, document in docs.items():
        wire_schema.WireValidator.check_schema(document)
        assert name in shipped_documents()
        assert (SHIPPED / f"{name}.json").exists()
    assert set(BUNDLES) <= v2.SERVER_FRAMES | v2.CLIENT_FRAMES


def test_every_client_frame_of_these_operations_has_a_schema() -> None:
    operations = ("watch", "unwatch", "control_", "steer", "session_", "sessions_", "queue_")
    persistent = {
        kind
        for kind in v2.ROLE_FRAMES["persistent"]
        if kind.startswith(operations)
        and kind not in ("session_transcript", "session_selection")
        and kind not in ("session_fork", "session_rewind")  # protocol.schema.rewind
    }
    assert persistent <= set(FRAMES)


def _events() -> list[dict[str, Any]]:
    request = v2.approval_request(
        APPROVAL_ID,
        "turn_1",
        SESSION,
        "mcp_tool",
        None,
        {"server": "s", "tool": "t"},
        ("allow_once", "reject"),
        1_700_000_000_000,
    )
    resolved = v2.approval_resolved(APPROVAL_ID, "allow_once", "editor#3")
    approval_resolved = {"event": "approval_resolved", "session_id": SESSION, "turn_id": "turn_1"}
    approval_resolved |= {k: v for k, v in resolved.items() if k != "t"}
    base = {"session_id": SESSION}
    return [
        {"event": "turn_started", **base, "turn_id": "turn_1", "by": "shim#1", "prompt": "hi"},
        {
            "event": "turn_started",
            **base,
            "turn_id": "t",
            "by": "q#1",
            "prompt": "",
            "complete": False,
        },
        {"event": "control_changed", **base, "controller": "editor#3"},
        {"event": "control_changed", **base, "controller": None},
        {"event": "control_requested", **base, "by": "cli#4", "timeout_ms": 30_000},
        _requested(request),
        approval_resolved,
        {"event": "queue_changed", **base, "entries": [ENTRY.item()]},
        {"event": "queue_changed", **base, "entries": []},
        {"event": "title_changed", **base, "title": None},
        {"event": "title_changed", **base, "title": "Fix the parser"},
        {"event": "rewound", **base, "to_cursor": CURSOR},
    ]


def test_every_session_event_validates() -> None:
    events = _events()
    assert {event["event"] for event in events} == set(EVENTS)
    for event in events:
        frame = v2.watch_event(event)
        wire_schema.check("v2.watch_event", frame)
        wire_schema.check("v2.watching", frame)


SERVER_FRAMES = [
    v2.watch_result(1, SESSION, [{"cursor": CURSOR, "kind": "terminal"}], True, CURSOR, False),
    v2.watch_more(1, [], False),
    v2.watch_message(SESSION, {"kind": "event", "event": "turn.started", "payload": {}}),
    v2.frame_error("watch_error", 1, v2.Code.RESYNC_REQUIRED),
    v2.frame_error("watch_error", None, v2.Code.INVALID_REQUEST),
    {"t": "unwatched", "id": 1, "session_id": SESSION},
    {"t": "watch_overloaded", "session_id": SESSION},
    {"t": "control_released", "id": 1, "session_id": SESSION},
    {"t": "control_requested", "session_id": SESSION, "by": "cli#4", "timeout_ms": 30_000},
    {"t": "control_answered", "id": 2, "session_id": SESSION},
    {"t": "control_changed", "session_id": SESSION, "controller": "cli#4"},
    {
        "t": "control_granted",
        "id": 3,
        "session_id": SESSION,
        "turns": [{"turn_id": "t", "sequence": 4}],
    },
    v2.frame_error("grant_error", 4, v2.Code.CONTROL_REFUSED),
    {"t": "steer_result", "id": 1, "turn_id": "turn_1"},
    v2.frame_error("steer_error", 1, v2.Code.UNKNOWN_TURN),
    {**v2.frame_error("steer_error", 1, v2.Code.TURN_FINISHED), "entry_id": ENTRY.entry_id},
    {"t": "sessions_result", "id": 1, "sessions": [ITEM], "next_cursor": None, "incomplete": False},
    {"t": "session_result", "id": 1, "session": library_item(SESSION, {}, 0)},
    v2.frame_error("session_error", 1, v2.Code.NOT_TURN_BOUNDARY),
    {"t": "queue_result", "id": 1, "session_id": SESSION, "entries": [ENTRY.item()]},
    {
        "t": "queue_result",
        "id": 1,
        "session_id": SESSION,
        "entries": [ENTRY.item()],
        "entry_id": ENTRY.entry_id,
    },
    v2.frame_error("queue_error", 1, v2.Code.NOT_CONTROLLER),
]
CLIENT_FRAMES = [
    {"t": "watch", "id": 1, "session_id": SESSION},
    {"t": "watch", "id": 1, "session_id": SESSION, "after_cursor": CURSOR},
    {"t": "unwatch", "id": 1, "session_id": SESSION},
    {"t": "control_release", "id": 1, "session_id": SESSION},
    {"t": "control_request", "id": 1, "session_id": SESSION},
    {"t": "control_answer", "id": 1, "session_id": SESSION, "grant": False},
    {"t": "steer", "id": 1, "turn_id": "turn_1", "text": "also check the docs"},
    {"t": "sessions_list", "id": 1},
    {
        "t": "sessions_list",
        "id": 1,
        "project_dir": "/p",
        "title": "fix",
        "archived": "all",
        "cursor": "1700:ses_1",
        "limit": v2.MAX_SESSION_PAGE_ITEMS,
    },
    {"t": "sessions_list", "id": 1, "archived": True, "limit": 1},
    {"t": "session_rename", "id": 1, "session_id": SESSION, "title": "x" * v2.MAX_TITLE_FILTER},
    {"t": "session_archive", "id": 1, "session_id": SESSION},
    {"t": "session_unarchive", "id": 1, "session_id": SESSION},
    {"t": "queue_add", "id": 1, "session_id": SESSION, "text": "é" * 8192},
    {"t": "queue_list", "id": 1, "session_id": SESSION},
    {"t": "queue_remove", "id": 1, "session_id": SESSION, "entry_id": ENTRY.entry_id},
    {
        "t": "queue_move",
        "id": 1,
        "session_id": SESSION,
        "entry_id": "q_1",
        "index": v2.MAX_QUEUE_INDEX,
    },
    {"t": "queue_send_now", "id": 1, "session_id": SESSION, "entry_id": ENTRY.entry_id},
]


@pytest.mark.parametrize("frame", SERVER_FRAMES + CLIENT_FRAMES)
def test_the_frames_validate(frame: dict[str, Any]) -> None:
    wire_schema.check(BUNDLES[frame["t"]], frame)
    wire_schema.check(f"v2.{frame['t']}", frame)


@pytest.mark.parametrize("frame", CLIENT_FRAMES)
def test_a_valid_client_frame_decodes(frame: dict[str, Any]) -> None:
    v2.decode(frame, "persistent")


def test_every_frame_type_has_an_example() -> None:
    assert {frame["t"] for frame in SERVER_FRAMES + CLIENT_FRAMES} == set(FRAMES)


REFUSED_CLIENT_FRAMES = [
    {"t": "watch", "id": 1},
    {"t": "watch", "id": 1, "session_id": SESSION, "after_cursor": "x" * (v2.MAX_CURSOR_BYTES + 1)},
    {"t": "unwatch", "id": 1, "session_id": ""},
    {"t": "control_answer", "id": 1, "session_id": SESSION, "grant": "yes"},
    {"t": "steer", "id": 1, "turn_id": "turn_1", "text": " \n"},
    {"t": "steer", "id": 1, "turn_id": "turn_1", "text": "x" * 16_385},
    {"t": "sessions_list", "id": 1, "archived": "some"},
    {"t": "sessions_list", "id": 1, "limit": v2.MAX_SESSION_PAGE_ITEMS + 1},
    {"t": "sessions_list", "id": 1, "limit": 0},
    {"t": "sessions_list", "id": 1, "title": ""},
    {
        "t": "session_rename",
        "id": 1,
        "session_id": SESSION,
        "title": "x" * (v2.MAX_TITLE_FILTER + 1),
    },
    {"t": "session_rename", "id": 1, "session_id": SESSION},
    {"t": "queue_add", "id": 1, "session_id": SESSION, "text": "é" * 8193},
    {"t": "queue_add", "id": 1, "session_id": SESSION, "text": "\t"},
    {"t": "queue_remove", "id": 1, "session_id": SESSION},
    {
        "t": "queue_move",
        "id": 1,
        "session_id": SESSION,
        "entry_id": "q_1",
        "index": v2.MAX_QUEUE_INDEX + 1,
    },
    {"t": "queue_move", "id": 1, "session_id": SESSION, "entry_id": "q_1", "index": -1},
    {"t": "queue_move", "id": 1, "session_id": SESSION, "entry_id": "q_1"},
]


@pytest.mark.parametrize("frame", REFUSED_CLIENT_FRAMES)
def test_a_client_frame_the_rfc_does_not_allow_is_refused_by_both(frame: dict[str, Any]) -> None:
    assert wire_schema.errors(BUNDLES[frame["t"]], frame)
    with pytest.raises(v2.Rejected):
        v2.decode(frame, "persistent")


@pytest.mark.parametrize(
    "frame",
    [
        {**v2.watch_more(1, [], False), "extra": 1},
        v2.watch_result(1, SESSION, [{}] * 1025, False, CURSOR, False),
        {"t": "watch_message", "session_id": SESSION},
        v2.frame_error("watch_error", 1, v2.Code.NOT_CONTROLLER),
        v2.watch_event({"event": "control_changed", "session_id": SESSION, "controller": 3}),
        v2.watch_event({"event": "title_changed", "session_id": SESSION, "title": "x" * 81}),
        v2.watch_event({"event": "rewound", "session_id": SESSION}),
        v2.watch_event(
            {"event": "turn_started", "session_id": SESSION, "turn_id": "t", "by": "a#1"}
        ),
        v2.watch_event({"event": "someday", "session_id": SESSION}),
        v2.watch_event(
            {
                "event": "queue_changed",
                "session_id": SESSION,
                "entries": [ENTRY.item()] * (MAX_QUEUE_ENTRIES + 1),
            }
        ),
        v2.watch_event(
            {
                "event": "queue_changed",
                "session_id": SESSION,
                "entries": [{**ENTRY.item(), "entry_id": "q_x"}],
            }
        ),
        v2.watch_event(
            {
                **_requested(
                    v2.approval_request(
                        APPROVAL_ID,
                        "turn_1",
                        SESSION,
                        "command",
                        None,
                        {"server": "s", "tool": "t"},
                        ("reject",),
                        1,
                    )
                )
            }
        ),
        {"t": "control_granted", "id": 1, "session_id": SESSION, "turns": [{"turn_id": "t"}]},
        {"t": "control_changed", "session_id": SESSION, "controller": None},
        v2.frame_error("grant_error", 1, v2.Code.UNKNOWN_ENTRY),
        {**v2.frame_error("steer_error", 1, v2.Code.TURN_FINISHED), "entry_id": "q_"},
        {"t": "steer_result", "id": 1},
        {
            "t": "sessions_result",
            "id": 1,
            "sessions": [ITEM] * 33,
            "next_cursor": None,
            "incomplete": False,
        },
        {"t": "session_result", "id": 1, "session": {**ITEM, "archived": None}},
        {"t": "session_result", "id": 1, "session": {**ITEM, "extra": 1}},
        {
            "t": "queue_result",
            "id": 1,
            "session_id": SESSION,
            "entries": [{**ENTRY.item(), "text": ""}],
        },
        v2.frame_error("queue_error", 1, v2.Code.CONTROL_REFUSED),
    ],
)
def test_a_daemon_frame_the_rfc_does_not_allow_is_refused(frame: dict[str, Any]) -> None:
    kind = frame["t"]
    assert wire_schema.errors(BUNDLES[kind], frame)
    assert wire_schema.errors(f"v2.{kind}", frame)
