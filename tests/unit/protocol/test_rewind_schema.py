"""The v2 fork and rewind frames' JSON Schemas (``protocol.schema.rewind``): valid 2020-12
documents, shipped, holding what the client library sends and the answers the daemon
builds from a real rewind plan, while refusing what the RFC does not allow; the file
states are every state the store's preview and commit give."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from magi_code.protocol import v2
from magi_code.protocol.schema import SHIPPED, shipped_documents
from magi_code.protocol.schema.rewind import BUNDLE, FRAMES, documents
from magi_code.sessions.checkpoints import FileState, PlannedFile, RestoreResult
from magi_code.sessions.rewind import RewindPlan, rewind_answer
from tests.support import wire_schema


def test_every_document_is_a_valid_schema_and_shipped() -> None:
    docs = documents()
    assert set(docs) == {f"v2.{kind}" for kind in FRAMES} | {BUNDLE}
    for name, document in docs.items():
        wire_schema.WireValidator.check_schema(document)
        assert name in shipped_documents()
        assert (SHIPPED / f"{name}.json").exists()
    assert set(FRAMES) <= v2.SERVER_FRAMES | v2.CLIENT_FRAMES


def test_the_file_states_are_the_stores() -> None:
    states = {*typing.get_args(FileState), *typing.get_args(RestoreResult), "kept"}
    assert states == set(v2.REWIND_FILE_STATES)


def _plan() -> RewindPlan:
    files = tuple(
        PlannedFile("/p", f"f{index}.txt", "", "x", state)
        for index, state in enumerate(("restore", "conflict", "not_restorable", "unchanged"))
    )
    messages = (
        {"kind": "message", "role": "user", "text": "y" * 500},
        {"kind": "terminal", "status": "completed"},
    )
    return RewindPlan("ses_1", 3, messages, files, True)


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "session_fork", "id": 1, "session_id": "ses_1", "at_cursor": "AQ"},
        {"t": "session_rewind", "id": 2, "session_id": "ses_1", "at_cursor": "AQ"},
        {
            "t": "session_rewind",
            "id": 3,
            "session_id": "ses_1",
            "at_cursor": "AQ",
            "files": False,
            "commit": True,
            "force": True,
        },
        {"t": "rewind_result", "id": 4, **rewind_answer(_plan(), None, True)},
        {
            "t": "rewind_result",
            "id": 5,
            **rewind_answer(_plan(), ["restored", "conflict", "not_restorable", "failed"], True),
        },
        {"t": "rewind_result", "id": 6, **rewind_answer(_plan(), [], False)},
    ],
)
def test_the_frames_validate(frame: dict[str, Any]) -> None:
    wire_schema.check(BUNDLE, frame)
    wire_schema.check(f"v2.{frame['t']}", frame)


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "session_fork", "id": 1, "session_id": "ses_1"},
        {"t": "session_rewind", "id": 1, "session_id": "ses_1", "at_cursor": "AQ", "commit": 1},
        {"t": "session_rewind", "id": 1, "session_id": "ses_1", "at_cursor": "x" * 129},
        {"t": "rewind_result", "id": 1, **rewind_answer(_plan(), None, True), "extra": 1},
        {
            "t": "rewind_result",
            "id": 1,
            **rewind_answer(_plan(), None, True),
            "files": [{"path": "a", "state": "gone"}],
        },
    ],
)
def test_what_the_rfc_does_not_allow_is_refused(frame: dict[str, Any]) -> None:
    assert wire_schema.errors(BUNDLE, frame)


def test_a_rewind_frame_with_every_flag_decodes_and_validates() -> None:
    frame = {
        "t": "session_rewind",
        "id": 7,
        "session_id": "ses_1",
        "at_cursor": "AQ",
        "files": True,
        "commit": False,
        "force": False,
    }
    assert v2.decode(frame, "persistent") == v2.SessionRewind(7, "ses_1", "AQ", True, False, False)
    wire_schema.check("v2.session_rewind", frame)
