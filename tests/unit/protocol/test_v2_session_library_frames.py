"""The session library frames (RFC-0002 §6.11): what a persistent client may send, and
that malformed ones are answered ``session_error`` ``invalid_request`` (never fatal)."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import (
    MAX_TITLE_FILTER,
    Fatal,
    Rejected,
    SessionChange,
    SessionsList,
    decode,
)


def test_defaults_and_filters_of_sessions_list() -> None:
    assert decode({"t": "sessions_list", "id": 1}, "persistent") == SessionsList(
        1, None, None, False, None, 32
    )
    full = {
        "t": "sessions_list",
        "id": 2,
        "project_dir": "/work/p",
        "title": "parser",
        "archived": "all",
        "cursor": "123:ses_x",
        "limit": 5,
    }
    assert decode(full, "persistent") == SessionsList(2, "/work/p", "parser", "all", "123:ses_x", 5)


def test_session_changes() -> None:
    rename = {"t": "session_rename", "id": 3, "session_id": "ses_a", "title": "New"}
    assert decode(rename, "persistent") == SessionChange("session_rename", 3, "ses_a", "New")
    archive = {"t": "session_archive", "id": 4, "session_id": "ses_a", "title": "ignored"}
    assert decode(archive, "persistent") == SessionChange("session_archive", 4, "ses_a", None)
    unarchive = {"t": "session_unarchive", "id": 5, "session_id": "ses_a"}
    assert decode(unarchive, "persistent") == SessionChange("session_unarchive", 5, "ses_a", None)


@pytest.mark.parametrize(
    "bad",
    [
        {"t": "sessions_list", "project_dir": "relative"},
        {"t": "sessions_list", "project_dir": "/a\x00b"},
        {"t": "sessions_list", "title": ""},
        {"t": "sessions_list", "title": "x" * (MAX_TITLE_FILTER + 1)},
        {"t": "sessions_list", "archived": 1},
        {"t": "sessions_list", "archived": "yes"},
        {"t": "sessions_list", "archived": None},
        {"t": "sessions_list", "cursor": ""},
        {"t": "sessions_list", "limit": 0},
        {"t": "sessions_list", "limit": 33},
        {"t": "sessions_list", "limit": True},
        {"t": "session_rename", "session_id": "ses_a"},
        {"t": "session_rename", "session_id": "ses_a", "title": ""},
        {"t": "session_archive"},
        {"t": "session_unarchive", "session_id": 7},
    ],
)
def test_malformed_library_frames_are_invalid_requests(bad: dict[str, Any]) -> None:
    with pytest.raises(Rejected) as rejected:
        decode({**bad, "id": 9}, "persistent")
    assert rejected.value.answer == {"t": "session_error", "id": 9, "code": "invalid_request"}


def test_library_frames_belong_to_the_persistent_role() -> None:
    for role in ("v1_shim", "control"):
        with pytest.raises(Fatal):
            decode({"t": "sessions_list", "id": 1}, role)
