"""Every frame a persistent client sends is built by a builder in ``protocol/v2.py`` and
read back by the daemon's decoder (``v2.decode``) as the typed value it handles
(RFC-0002); the client library spells no frame member itself."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import magi_code
from magi_code.protocol import v2
from magi_code.protocol.frames import HEADER, decode_body, encode_frame
from magi_code.protocol.v2 import (
    ROLE_FRAMES,
    ApprovalAnswer,
    Attach,
    Control,
    ControlAnswer,
    FsResult,
    GrantsList,
    GrantsRevoke,
    McpServer,
    QueueFrame,
    Request,
    SessionChange,
    SessionFork,
    SessionFrame,
    SessionPolicy,
    SessionRewind,
    SessionSelection,
    SessionsList,
    SessionTranscript,
    Snapshot,
    Steer,
    TakeControl,
    Watch,
)
from tests.support.product_source import parsed_modules

ENVELOPE = {"kind": "request", "request_id": "r1", "method": "turn.start", "params": {}}
SERVER = {"name": "files", "command": "/bin/mcp", "args": ["-v"], "env": {"A": "1"}}

# Each persistent client frame type: its builder's output (frame ID 7, where the daemon
# answers by ID) and the typed value the daemon's decoder makes of it.
BUILT: dict[str, tuple[dict[str, Any], object]] = {
    "request": (
        v2.request(ENVELOPE, 5_000, "k" * 16, [SERVER]),
        Request(
            ENVELOPE, "r1", 5_000, "k" * 16, (McpServer("files", "/bin/mcp", ("-v",), {"A": "1"}),)
        ),
    ),
    "fs_result": (v2.fs_result("f1", "text", None), FsResult("f1", "text", None)),
    "control": (v2.control(7, "status"), Control(7, "status")),
    "take_control": (v2.take_control(7, "s1"), TakeControl(7, "s1")),
    "snapshot": (
        v2.snapshot(7, "s1", "/work/p", ["t1", "t2"], "c1"),
        Snapshot(7, "s1", frozenset({"t1", "t2"}), "/work/p", "c1"),
    ),
    "attach": (v2.attach(7, "t1", 3, "s1"), Attach(7, "t1", 3, "s1")),
    "approval_answer": (
        v2.approval_answer(7, "a1", "allow_once"),
        ApprovalAnswer(7, "a1", "allow_once"),
    ),
    "grants_list": (v2.grants_list(7, "s1"), GrantsList(7, "s1")),
    "grants_revoke": (
        v2.grants_revoke(7, "session", "commands", ["git", "status"], "s1"),
        GrantsRevoke(7, "session", "s1", "commands", ("git", "status")),
    ),
    "approval_policy": (v2.approval_policy(7, "s1", "ask"), SessionPolicy(7, "s1", "ask")),
    "watch": (v2.watch(7, "s1", "c3"), Watch(7, "s1", "c3")),
    "unwatch": (v2.unwatch(7, "s1"), SessionFrame("unwatch", 7, "s1")),
    "control_release": (v2.control_release(7, "s1"), SessionFrame("control_release", 7, "s1")),
    "control_request": (v2.control_request(7, "s1"), SessionFrame("control_request", 7, "s1")),
    "control_answer": (v2.control_answer(7, "s1", True), ControlAnswer(7, "s1", True)),
    "steer": (v2.steer(7, "t1", "also this"), Steer(7, "t1", "also this")),
    "sessions_list": (
        v2.sessions_list(7, "all", 10, "/work/p", "fix", "c2"),
        SessionsList(7, "/work/p", "fix", "all", "c2", 10),
    ),
    "session_rename": (
        v2.session_rename(7, "s1", "A title"),
        SessionChange("session_rename", 7, "s1", "A title"),
    ),
    "session_archive": (
        v2.session_archive(7, "s1"),
        SessionChange("session_archive", 7, "s1", None),
    ),
    "session_unarchive": (
        v2.session_unarchive(7, "s1"),
        SessionChange("session_unarchive", 7, "s1", None),
    ),
    "queue_add": (v2.queue_add(7, "s1", "next"), QueueFrame("queue_add", 7, "s1", "next")),
    "queue_list": (v2.queue_list(7, "s1"), QueueFrame("queue_list", 7, "s1")),
    "queue_remove": (
        v2.queue_remove(7, "s1", "q1"),
        QueueFrame("queue_remove", 7, "s1", entry_id="q1"),
    ),
    "queue_move": (
        v2.queue_move(7, "s1", "q1", 2),
        QueueFrame("queue_move", 7, "s1", entry_id="q1", index=2),
    ),
    "queue_send_now": (
        v2.queue_send_now(7, "s1", "q1"),
        QueueFrame("queue_send_now", 7, "s1", entry_id="q1"),
    ),
    "session_transcript": (v2.session_transcript(7, "s1", "12"), SessionTranscript(7, "s1", 12)),
    "session_selection": (
        v2.session_selection(7, "s1", "p", "m", "high"),
        SessionSelection(7, "s1", "p", "m", "high"),
    ),
    "session_fork": (v2.session_fork(7, "s1", "c4"), SessionFork(7, "s1", "c4")),
    "session_rewind": (
        v2.session_rewind(7, "s1", "c4", False, True, True),
        SessionRewind(7, "s1", "c4", False, True, True),
    ),
}

# The builders' defaults: the optional members left out, as the daemon reads them.
DEFAULTS: list[tuple[dict[str, Any], object]] = [
    (v2.snapshot(7), Snapshot(7)),
    (v2.attach(7, "t1"), Attach(7, "t1", -1, None)),
    (v2.grants_list(7, None), GrantsList(7, None)),
    (
        v2.grants_revoke(7, "project", "paths", "src/a.py", None),
        GrantsRevoke(7, "project", None, "paths", "src/a.py"),
    ),
    (v2.approval_policy(7, "s1", None), SessionPolicy(7, "s1", None)),
    (v2.watch(7, "s1"), Watch(7, "s1", None)),
    (v2.sessions_list(7, False, 32), SessionsList(7, None, None, False, None, 32)),
    (v2.session_transcript(7, "s1"), SessionTranscript(7, "s1", 0)),
    (v2.session_selection(7, "s1", None, None, None), SessionSelection(7, "s1", None, None, None)),
]


def from_wire(frame: dict[str, Any]) -> object:
    wire = encode_frame(frame)
    return v2.decode(decode_body(wire[HEADER.size :]), "persistent")


def test_every_persistent_client_frame_type_has_a_builder() -> None:
    assert set(BUILT) == ROLE_FRAMES["persistent"]


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_what_a_builder_makes_the_daemon_reads_back_from_the_wire(kind: str) -> None:
    frame, expected = BUILT[kind]
    assert v2.call_type(frame) == kind
    assert from_wire(frame) == expected


@pytest.mark.parametrize(("frame", "expected"), DEFAULTS)
def test_optional_members_left_out_are_read_as_their_defaults(
    frame: dict[str, Any], expected: object
) -> None:
    assert from_wire(frame) == expected


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_a_frame_answered_by_id_carries_it_last(kind: str) -> None:
    # The member order the client always sent: ``t``, the members, then ``id``.
    frame, _ = BUILT[kind]
    members = list(frame)
    assert members[0] == "t"
    assert ("id" in members) == (kind not in {"request", "fs_result"})
    assert "id" not in members or members[-1] == "id"


def test_the_client_library_builds_no_frame_itself() -> None:
    # Its frames come from the builders of protocol/v2.py, each given every member but
    # the frame ID: there is no general builder, and no map of the client's has a
    # frame's type or ID.
    assert not hasattr(v2, "call")
    root = Path(magi_code.__file__).parent / "client"
    members = {"t", "id"}
    spelled = []
    for path, tree in parsed_modules():
        if not path.is_relative_to(root):
            continue
        for node in ast.walk(tree):
            keys: list[ast.expr | None] = []
            if isinstance(node, ast.Dict):
                keys = list(node.keys)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                keys = [node.slice]
            if any(isinstance(key, ast.Constant) and key.value in members for key in keys):
                spelled.append(f"{path.relative_to(root)}:{node.lineno}")
    assert spelled == []
