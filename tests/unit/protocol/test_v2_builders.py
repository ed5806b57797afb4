"""Every frame the daemon sends is built by a builder in ``protocol/v2.py`` and read back
by the decoder its client uses (RFC-0002); no module outside ``protocol/`` spells a
frame's ``"t"`` itself."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import magi_code
from magi_code.protocol import v2
from magi_code.protocol.frames import HEADER, decode_body, encode_frame
from magi_code.protocol.v2 import (
    SERVER_FRAMES,
    AnswerFrame,
    ApprovalRequestFrame,
    ApprovalResolvedFrame,
    AttachPart,
    CallFailed,
    Code,
    ControlChangedFrame,
    ControlGrantedResult,
    ControlRequestedFrame,
    ControlResult,
    Done,
    End,
    FatalFrame,
    FsRequestFrame,
    GrantsResult,
    MessageFrame,
    Next,
    Output,
    OverloadedFrame,
    PolicyResult,
    QueueResult,
    Refused,
    RequestErrorFrame,
    RewindAnswer,
    SelectionResult,
    SessionResult,
    SessionsResult,
    SnapshotResult,
    ToolDetailFrame,
    TranscriptResult,
    TurnStartedFrame,
    WatchFrame,
    WatchPart,
)
from tests.support.product_source import parsed_modules

EVENT = {"kind": "event", "event": "turn.delta", "payload": {"text": "hi"}, "sequence": 3}
RESPONSE = {"kind": "response", "request_id": "r1", "ok": True, "payload": {}}
TURN = {"turn_id": "t1", "status": "running"}
SESSION = {"session_id": "s1", "title": None}
ENTRY = {"entry_id": "q1", "text": "next", "by": "cli", "added_at": "2026-01-01T00:00:00Z"}
EFFECTIVE = {
    "provider_id": "p",
    "model_id": "m",
    "thinking_level": "default",
    "available_thinking_levels": ["default", "high"],
}
CALL = {"tool": "read_file", "arguments": {"path": "a"}, "locations": []}
TOOL_CALL = {"kind": "tool_call", "turn_id": "t1", "call_id": "c1", "status": "completed"}
REWIND = {"files": [{"path": "a", "state": "restored"}], "messages": [{"cursor": "4"}]}
STARTED = {"event": "turn_started", "session_id": "s1", "turn_id": "t1", "by": "cli"}
ERRORS = sorted(v2._CALL_ERRORS)


def answer(kind: str, body: Any, frame_id: int = 7) -> AnswerFrame:
    return AnswerFrame(kind, frame_id, body)


# Each daemon frame type: its builder's output and what the client's decoder makes of it.
BUILT: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], object], object]] = {
    "welcome": (
        v2.welcome("1.0", "b1", "i1", 42, "persistent", {"max_frame_bytes": 1}, ("v1_bridge",)),
        v2.server_frame_type,
        "welcome",
    ),
    "refused": (v2.refused(Code.DRAINING), v2.decode_refused, Refused("draining")),
    "output": (
        v2.output(2, b"{}\n", True, [{"turn_id": "t1", "failure": "x", "remedy": None}]),
        v2.decode_shim_frame,
        Output(b"{}\n", 2, [{"turn_id": "t1", "failure": "x", "remedy": None}], True),
    ),
    "next": (v2.next_record(), v2.decode_shim_frame, Next()),
    "end": (v2.end("output_error", "gone"), v2.decode_shim_frame, End("output_error", "gone")),
    "error": (
        v2.error(Code.FRAMING_ERROR),
        v2.decode_persistent_frame,
        FatalFrame("framing_error", v2.MESSAGES[Code.FRAMING_ERROR]),
    ),
    "message": (
        v2.message(RESPONSE),
        v2.decode_persistent_frame,
        MessageFrame(RESPONSE, True, "r1"),
    ),
    "overloaded": (v2.overloaded("t1", 9), v2.decode_persistent_frame, OverloadedFrame("t1", 9)),
    "request_error": (
        v2.request_error("r1", Code.DEADLINE_EXCEEDED),
        v2.decode_persistent_frame,
        RequestErrorFrame("r1", "deadline_exceeded", v2.MESSAGES[Code.DEADLINE_EXCEEDED]),
    ),
    "control_result": (
        v2.control_result(7, {"stopping": True}),
        v2.decode_persistent_frame,
        answer("control_result", ControlResult({"stopping": True})),
    ),
    "snapshot_result": (
        v2.snapshot_result(7, [TURN], "c2"),
        v2.decode_persistent_frame,
        answer("snapshot_result", SnapshotResult([TURN], "c2")),
    ),
    "attach_result": (
        v2.attach_result(7, "finished", [EVENT], False, "provider_error"),
        v2.decode_persistent_frame,
        answer("attach_result", AttachPart("finished", [EVENT], False, "provider_error")),
    ),
    "attach_more": (
        v2.attach_more(7, [EVENT], True),
        v2.decode_persistent_frame,
        answer("attach_more", AttachPart(None, [EVENT], True, None)),
    ),
    "control_granted": (
        v2.control_granted(7, "s1", [TURN]),
        v2.decode_persistent_frame,
        answer("control_granted", ControlGrantedResult("s1", [TURN])),
    ),
    "approval_request": (
        v2.approval_request("a1", "t1", "s1", "command", "x1", {"argv": ["ls"]}, ["deny"], 500),
        v2.decode_persistent_frame,
        ApprovalRequestFrame("a1", "t1", "s1", "command", {"argv": ["ls"]}, ("deny",), 500, "x1"),
    ),
    "approval_resolved": (
        v2.approval_resolved("a1", "deny", "cli"),
        v2.decode_persistent_frame,
        ApprovalResolvedFrame("a1", "deny", "cli", None),
    ),
    "approval_already_resolved": (
        v2.approval_resolved("a1", "deny", "cli", already=True, frame_id=7),
        v2.decode_persistent_frame,
        answer("approval_already_resolved", ApprovalResolvedFrame("a1", "deny", "cli", None)),
    ),
    "grants_result": (
        v2.grants_result(7, None, {"commands": []}, True),
        v2.decode_persistent_frame,
        answer("grants_result", GrantsResult(None, {"commands": []}, True)),
    ),
    "tool_detail": (
        v2.tool_detail("x1", {"call": CALL}, "t1", "s1"),
        v2.decode_persistent_frame,
        ToolDetailFrame("t1", "s1", "x1", {"call": CALL}),
    ),
    "fs_request": (
        v2.fs_request("f1", "write", "a.txt", "text", "t1", "s1"),
        v2.decode_persistent_frame,
        FsRequestFrame("f1", "t1", "s1", "write", "a.txt", "text"),
    ),
    "approval_policy_result": (
        v2.approval_policy_result(7, "s1", None, "ask"),
        v2.decode_persistent_frame,
        answer("approval_policy_result", PolicyResult("ask")),
    ),
    "watch_result": (
        v2.watch_result(7, "s1", [STARTED], False, "c0", True),
        v2.decode_persistent_frame,
        answer("watch_result", WatchPart("s1", [STARTED], False, "c0", True)),
    ),
    "watch_more": (
        v2.watch_more(7, [STARTED], False),
        v2.decode_persistent_frame,
        answer("watch_more", WatchPart(None, [STARTED], False, None, None)),
    ),
    "unwatched": (v2.unwatched(7, "s1"), v2.decode_persistent_frame, answer("unwatched", Done())),
    "watch_event": (
        v2.watch_event({**STARTED, "prompt": "go"}),
        v2.decode_persistent_frame,
        WatchFrame("s1", TurnStartedFrame("s1", "t1", "cli", "go", True), False),
    ),
    "watch_message": (
        v2.watch_message("s1", EVENT),
        v2.decode_persistent_frame,
        WatchFrame("s1", EVENT, False),
    ),
    "watch_overloaded": (
        v2.watch_overloaded("s1"),
        v2.decode_persistent_frame,
        WatchFrame("s1", None, True),
    ),
    "control_released": (
        v2.control_released(7, "s1"),
        v2.decode_persistent_frame,
        answer("control_released", Done()),
    ),
    "control_requested": (
        v2.control_requested("s1", "editor", 30_000),
        v2.decode_persistent_frame,
        ControlRequestedFrame("s1", "editor", 30_000),
    ),
    "control_answered": (
        v2.control_answered(7, "s1"),
        v2.decode_persistent_frame,
        answer("control_answered", Done()),
    ),
    "control_changed": (
        v2.control_changed("s1", "editor"),
        v2.decode_persistent_frame,
        ControlChangedFrame("s1", "editor"),
    ),
    "steer_result": (
        v2.steer_result(7, "t1"),
        v2.decode_persistent_frame,
        answer("steer_result", Done()),
    ),
    "sessions_result": (
        v2.sessions_result(7, [SESSION], "c1", False),
        v2.decode_persistent_frame,
        answer("sessions_result", SessionsResult([SESSION], "c1", False)),
    ),
    "session_result": (
        v2.session_result(7, SESSION),
        v2.decode_persistent_frame,
        answer("session_result", SessionResult(SESSION)),
    ),
    "queue_result": (
        v2.queue_result(7, "s1", [ENTRY], "q1"),
        v2.decode_persistent_frame,
        answer("queue_result", QueueResult("s1", [ENTRY], "q1")),
    ),
    "transcript_result": (
        v2.transcript_result(7, [{**TOOL_CALL, "call": CALL}], None, False),
        v2.decode_persistent_frame,
        answer("transcript_result", TranscriptResult([{**TOOL_CALL, "call": CALL}], None, False)),
    ),
    "session_selection_result": (
        v2.session_selection_result(7, "s1", EFFECTIVE),
        v2.decode_persistent_frame,
        answer("session_selection_result", SelectionResult("s1", EFFECTIVE)),
    ),
    "rewind_result": (
        v2.rewind_result(7, REWIND),
        v2.decode_persistent_frame,
        answer("rewind_result", RewindAnswer(REWIND)),
    ),
    **{
        kind: (
            v2.frame_error(kind, 7, Code.INVALID_REQUEST),
            v2.decode_persistent_frame,
            answer(kind, CallFailed("invalid_request")),
        )
        for kind in ERRORS
    },
}


def test_every_daemon_frame_type_has_a_builder() -> None:
    assert set(BUILT) == SERVER_FRAMES


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_what_a_builder_makes_its_decoder_reads_back_from_the_wire(kind: str) -> None:
    frame, decode, expected = BUILT[kind]
    assert frame["t"] == kind
    wire = encode_frame(frame)
    assert decode(decode_body(wire[HEADER.size :])) == expected


def test_a_late_steer_error_names_the_queue_entry_its_text_became() -> None:
    frame = v2.frame_error("steer_error", 3, Code.TURN_FINISHED, "q9")
    assert v2.decode_persistent_frame(frame) == AnswerFrame(
        "steer_error", 3, CallFailed("turn_finished", "q9")
    )


def test_an_output_without_failures_or_answer_carries_only_its_bytes() -> None:
    assert v2.output(1, b"x", False, []) == {"t": "output", "seq": 1, "data": b"x"}


def test_no_module_outside_protocol_spells_a_frame_type() -> None:
    # A frame's members are spelled where its builder and decoder are: protocol/v2.py.
    root = Path(magi_code.__file__).parent
    spelled = []
    for path, tree in parsed_modules():
        if path.is_relative_to(root / "protocol"):  # v2.py, and the schemas of its frames
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and any(
                isinstance(key, ast.Constant) and key.value == "t" for key in node.keys
            ):
                spelled.append(f"{path.relative_to(root)}:{node.lineno}")
    assert spelled == []
