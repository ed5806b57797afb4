"""The v2 approval frames' JSON Schemas (``protocol.schema.approvals``): valid 2020-12
documents, shipped (``test_schema`` regenerates them), and holding the frames the daemon's
builders make and the client library sends, while refusing what the RFC does not allow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from magi_code.protocol import v2
from magi_code.protocol.schema import SHIPPED, shipped_documents
from magi_code.protocol.schema.approvals import BUNDLE, FRAMES, documents
from magi_code.tools.base import ToolContext
from magi_code.tools.builtin import BUILTIN_TOOLS
from magi_code.turns.approvals import DECISIONS, subject
from tests.support import wire_schema

APPROVAL_ID = "appr_0123456789abcdef01234567"


def test_every_document_is_a_valid_schema_and_shipped() -> None:
    docs = documents()
    assert set(docs) == {f"v2.{kind}" for kind in FRAMES} | {"v2.history.approval", BUNDLE}
    for name, document in docs.items():
        wire_schema.WireValidator.check_schema(document)
        assert name in shipped_documents()
        assert (SHIPPED / f"{name}.json").exists()
    assert set(FRAMES) <= v2.SERVER_FRAMES | v2.CLIENT_FRAMES


def _request(kind: str, summary: dict[str, Any]) -> dict[str, Any]:
    return v2.approval_request(
        APPROVAL_ID, "turn_1", "ses_1", kind, None, summary, DECISIONS, 1_700_000_000_000
    )


def test_the_summaries_the_gate_makes_validate_and_belong_to_their_kind(tmp_path: Path) -> None:
    tools = {tool.name: tool for tool in BUILTIN_TOOLS}
    ctx = ToolContext(project_dir=tmp_path)
    (tmp_path / "a.txt").write_text("old\n")
    command = subject(tools["shell"], {"command": "git status --short"}, ctx)
    edit = subject(
        tools["edit_file"], {"path": "a.txt", "old_string": "old", "new_string": "new"}, ctx
    )
    assert command is not None and edit is not None
    assert command.summary is not None and edit.summary is not None
    frames = {
        "command": _request("command", dict(command.summary)),
        "file_change": _request("file_change", dict(edit.summary)),
        "mcp_tool": _request("mcp_tool", {"server": "docs", "tool": "search"}),
    }
    for frame in frames.values():
        wire_schema.check(BUNDLE, frame)
        wire_schema.check("v2.approval_request", frame)
    # A summary of another kind's shape is refused.
    wrong = {**frames["command"], "summary": frames["file_change"]["summary"]}
    assert wire_schema.errors("v2.approval_request", wrong)


@pytest.mark.parametrize(
    "frame",
    [
        v2.approval_resolved(APPROVAL_ID, "allow_once", "editor#3"),
        v2.approval_resolved(APPROVAL_ID, v2.APPROVAL_TIMED_OUT, v2.APPROVAL_DEADLINE_BY),
        v2.approval_resolved(APPROVAL_ID, "reject", "x#1", already=True, frame_id=4),
        v2.frame_error("approval_error", 2, v2.Code.UNKNOWN_APPROVAL),
        {"t": "approval_answer", "id": 1, "approval_id": APPROVAL_ID, "decision": "reject"},
    ],
)
def test_the_other_frames_validate(frame: dict[str, Any]) -> None:
    wire_schema.check(BUNDLE, frame)
    wire_schema.check(f"v2.{frame['t']}", frame)


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "approval_resolved", "approval_id": APPROVAL_ID, "decision": "maybe", "by": "x"},
        {"t": "approval_answer", "id": 1, "approval_id": APPROVAL_ID, "decision": "timed_out"},
        {"t": "approval_error", "id": 1, "code": "session_busy"},
        {**_request("mcp_tool", {"server": "s", "tool": "t"}), "extra": 1},
        {**_request("mcp_tool", {"server": "s", "tool": "t"}), "approval_id": "appr_x"},
    ],
)
def test_what_the_rfc_does_not_allow_is_refused(frame: dict[str, Any]) -> None:
    assert wire_schema.errors(BUNDLE, frame)
