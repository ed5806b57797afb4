"""Daemon frames as a client reads them (RFC-0002): the frame type is validated once,
and the frames the handshake, the shim and a persistent client act on become typed
values."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import (
    SERVER_FRAMES,
    AnswerFrame,
    ApprovalResolvedFrame,
    AttachPart,
    CallFailed,
    Code,
    ControlChangedFrame,
    Done,
    End,
    FatalFrame,
    Malformed,
    MessageFrame,
    Next,
    Output,
    OverloadedFrame,
    QueueChangedFrame,
    QueueResult,
    Refused,
    RequestErrorFrame,
    SnapshotResult,
    TitleChangedFrame,
    TurnStartedFrame,
    WatchFrame,
    WatchPart,
    approval_resolved,
    attach_more,
    attach_result,
    decode_persistent_frame,
    decode_refused,
    decode_shim_frame,
    error,
    frame_error,
    message,
    overloaded,
    refused,
    request_error,
    server_frame_type,
    snapshot_result,
    watch_event,
    watch_message,
    watch_result,
)
from magi_code.sessions.queue import QueueEntry


def test_the_type_of_a_daemon_frame_is_one_the_daemon_sends() -> None:
    assert server_frame_type(refused(Code.DRAINING)) == "refused"
    assert server_frame_type(error(Code.FRAMING_ERROR)) == "error"
    assert all(server_frame_type({"t": kind}) == kind for kind in SERVER_FRAMES)
    # a client frame, an unknown name, a non-string and no type at all
    for frame in ({"t": "hello"}, {"t": "surprise"}, {"t": 7}, {}):
        assert server_frame_type(frame) is None


def test_a_refusal_names_its_code() -> None:
    assert decode_refused(refused(Code.TOOL_PROCESS)) == Refused("tool_process")
    assert decode_refused({"t": "refused", "code": 3}) == Refused(None)
    assert decode_refused({"t": "refused"}) == Refused(None)
    assert decode_refused({"t": "welcome", "code": "draining"}) is None


def test_the_frames_a_shim_reads() -> None:
    failures = [{"turn_id": "t1", "failure": "provider_error"}]
    frame = {"t": "output", "seq": 4, "data": b"{}\n", "failures": failures, "answers": True}
    assert decode_shim_frame(frame) == Output(b"{}\n", 4, failures, True)
    assert decode_shim_frame({"t": "output", "seq": 5, "data": b""}) == Output(b"", 5, None, False)
    assert decode_shim_frame({"t": "next"}) == Next()
    assert decode_shim_frame({"t": "end", "status": "ok"}) == End("ok", None)
    assert decode_shim_frame({"t": "end", "status": "output_error", "detail": "x"}) == End(
        "output_error", "x"
    )
    assert decode_shim_frame({"t": "end", "status": 1, "detail": ["x"]}) == End(None, None)


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "output", "seq": 1, "data": "not bytes"},
        {"t": "output", "seq": 1},
        {"t": "message", "message": {}},  # a persistent client's frame
        {"t": "surprise"},
        {},
    ],
)
def test_any_other_frame_is_none_to_a_shim(frame: dict[str, Any]) -> None:
    assert decode_shim_frame(frame) is None


EVENT = {"kind": "event", "event": "turn.started", "payload": {}}


def test_the_frames_a_persistent_client_reads_as_the_daemon_builds_them() -> None:
    decode = decode_persistent_frame
    assert decode(message(EVENT)) == MessageFrame(EVENT, False, None)
    response = {"kind": "response", "request_id": "r1", "payload": {}, "error": None}
    assert decode(message(response)) == MessageFrame(response, True, "r1")
    assert decode(error(Code.CLIENT_STALLED)) == FatalFrame(
        "client_stalled", "the client did not read or acknowledge output in time"
    )
    assert decode({"t": "error"}) == FatalFrame("protocol_error", None)
    assert decode(request_error("r2", Code.DEADLINE_EXCEEDED)) == RequestErrorFrame(
        "r2", "deadline_exceeded", "the request deadline passed before it could run"
    )
    assert decode(overloaded("t1", 7)) == OverloadedFrame("t1", 7)
    assert decode(snapshot_result(3, [{"turn_id": "t1"}], None)) == AnswerFrame(
        "snapshot_result", 3, SnapshotResult([{"turn_id": "t1"}], None)
    )
    assert decode(attach_result(4, "finished", [EVENT], True, "provider_error")) == AnswerFrame(
        "attach_result", 4, AttachPart("finished", [EVENT], True, "provider_error")
    )
    assert decode(attach_more(4, [], False)) == AnswerFrame(
        "attach_more", 4, AttachPart(None, [], False, None)
    )
    assert decode(watch_result(5, "s1", [], False, "c0", True)) == AnswerFrame(
        "watch_result", 5, WatchPart("s1", [], False, "c0", True)
    )
    assert decode(frame_error("watch_error", 5, Code.RESYNC_REQUIRED)) == AnswerFrame(
        "watch_error", 5, CallFailed("resync_required")
    )
    assert decode({"t": "unwatched", "id": "x"}) == AnswerFrame("unwatched", None, Done())
    resolved = ApprovalResolvedFrame("a1", "allow_once", "cli#1", None)
    assert decode(approval_resolved("a1", "allow_once", "cli#1")) == resolved
    assert decode(
        approval_resolved("a1", "allow_once", "cli#1", already=True, frame_id=6)
    ) == AnswerFrame("approval_already_resolved", 6, resolved)
    assert decode(watch_message("s1", EVENT)) == WatchFrame("s1", EVENT, False)
    started = {"event": "turn_started", "session_id": "s1", "turn_id": "t1", "by": "cli#1"}
    assert decode(watch_event({**started, "prompt": "hi"})) == WatchFrame(
        "s1", TurnStartedFrame("s1", "t1", "cli#1", "hi", True), False
    )
    changed = {"event": "control_changed", "session_id": "s1", "controller": None}
    assert decode(watch_event(changed)) == WatchFrame("s1", ControlChangedFrame("s1", None), False)
    newer = {"event": "a_newer_daemons_event", "session_id": "s1"}
    assert decode(watch_event(newer)) == WatchFrame("s1", None, False)
    assert decode({"t": "watch_overloaded", "session_id": "s1"}) == WatchFrame("s1", None, True)
    assert decode({"t": "surprise"}) is None


ENTRY = QueueEntry("q_1", "next, run the tests", "cli#1", "2026-12-05T03:00:00Z").item()


def test_the_prompt_queue_frames_as_the_daemon_builds_them() -> None:
    decode = decode_persistent_frame
    added = {"t": "queue_result", "id": 7, "session_id": "s1", "entries": [ENTRY]}
    assert decode({**added, "entry_id": "q_1"}) == AnswerFrame(
        "queue_result", 7, QueueResult("s1", [ENTRY], "q_1")
    )
    assert decode({**added, "entries": []}) == AnswerFrame(
        "queue_result", 7, QueueResult("s1", [], None)
    )
    assert decode(frame_error("queue_error", 8, Code.NOT_CONTROLLER)) == AnswerFrame(
        "queue_error", 8, CallFailed("not_controller")
    )
    # A late steer's text went to the head of the queue (§6.10); only a steer_error says so.
    late = frame_error("steer_error", 9, Code.TURN_FINISHED)
    assert decode({**late, "entry_id": "q_2"}) == AnswerFrame(
        "steer_error", 9, CallFailed("turn_finished", "q_2")
    )
    assert decode(late) == AnswerFrame("steer_error", 9, CallFailed("turn_finished"))
    unknown = frame_error("queue_error", 10, Code.UNKNOWN_ENTRY)
    assert decode({**unknown, "entry_id": "q_3"}) == AnswerFrame(
        "queue_error", 10, CallFailed("unknown_entry")
    )
    changed = {"event": "queue_changed", "session_id": "s1", "entries": [ENTRY]}
    assert decode(watch_event(changed)) == WatchFrame("s1", QueueChangedFrame("s1", [ENTRY]), False)
    renamed = {"event": "title_changed", "session_id": "s1", "title": "Refactor"}
    assert decode(watch_event(renamed)) == WatchFrame(
        "s1", TitleChangedFrame("s1", "Refactor"), False
    )
    assert decode(watch_event({**renamed, "title": None})) == WatchFrame(
        "s1", TitleChangedFrame("s1", None), False
    )


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "welcome"},  # a handshake's frame
        {"t": "output", "data": b""},  # a shim's frame
        {"t": "message", "message": {"kind": "event", "event": "x"}},
        {"t": "message", "message": {"kind": "other"}},
        {"t": "overloaded", "turn_id": "t1", "after_sequence": True},
        {"t": "tool_detail", "turn_id": "t", "session_id": "s", "activity_id": "a"},
        {"t": "fs_request", "fs_id": "f", "turn_id": "t", "session_id": "s", "op": "read"},
        {"t": "approval_resolved", "approval_id": "a1", "decision": "deny"},
        {"t": "watch_event", "session_id": "s1", "event": "approval_resolved"},
        {"t": "watch_event", "session_id": "s1"},
        {"t": "watch_message", "message": EVENT},
        {"t": "control_result", "id": 1, "result": []},
        {"t": "attach_result", "id": 1, "status": "lost", "events": [], "more": False},
        {"t": "attach_more", "id": 1, "events": [1], "more": False},
        {"t": "watch_more", "id": 1, "events": [], "more": "no"},
        {"t": "watch_result", "id": 1, "events": [], "more": False, "gap": False},
        {"t": "grants_result", "id": 1, "session": None, "project": {}},
        {"t": "sessions_result", "id": 1, "sessions": [], "next_cursor": 3},
        {"t": "session_result", "id": 1},
        {"t": "queue_result", "id": 1, "session_id": "s1"},
        {"t": "queue_result", "id": 1, "entries": [{"entry_id": "q_1", "text": "x"}]},
        {"t": "queue_result", "id": 1, "entries": [ENTRY], "entry_id": 1},
        {"t": "steer_error", "id": 1, "code": "turn_finished", "entry_id": ["q_1"]},
        {"t": "watch_event", "session_id": "s1", "event": "queue_changed", "entries": {}},
        {"t": "watch_event", "session_id": "s1", "event": "queue_changed", "entries": ["q_1"]},
        {"t": "watch_event", "session_id": "s1", "event": "title_changed", "title": 3},
    ],
)
def test_a_frame_that_does_not_fit_its_type_is_malformed(frame: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        decode_persistent_frame(frame)
