"""The fork and rewind frames (RFC-0002 §6.16): their defaults, and that malformed ones
are answered ``session_error`` ``invalid_request`` (never fatal); only a persistent
connection sends them."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import Fatal, Rejected, SessionFork, SessionRewind, decode


def test_fork_and_rewind_with_their_defaults() -> None:
    fork = {"t": "session_fork", "id": 1, "session_id": "ses_a", "at_cursor": "c1"}
    assert decode(fork, "persistent") == SessionFork(1, "ses_a", "c1")
    rewind = {"t": "session_rewind", "id": 2, "session_id": "ses_a", "at_cursor": "c1"}
    assert decode(rewind, "persistent") == SessionRewind(2, "ses_a", "c1", True, False, False)
    flags = {**rewind, "files": False, "commit": True, "force": True}
    assert decode(flags, "persistent") == SessionRewind(2, "ses_a", "c1", False, True, True)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"session_id": "ses_a"},
        {"session_id": 7, "at_cursor": "c"},
        {"session_id": "ses_a", "at_cursor": ""},
        {"session_id": "ses_a", "at_cursor": "c" * 129},
        {"session_id": "ses_a", "at_cursor": "c", "commit": "yes"},
        {"session_id": "ses_a", "at_cursor": "c", "files": 1},
        {"session_id": "ses_a", "at_cursor": "c", "force": None},
    ],
)
@pytest.mark.parametrize("kind", ["session_fork", "session_rewind"])
def test_bad_arguments_are_invalid_request(kind: str, fields: dict[str, Any]) -> None:
    with pytest.raises(Rejected) as rejected:
        decode({"t": kind, "id": 9, **fields}, "persistent")
    assert rejected.value.answer == {"t": "session_error", "id": 9, "code": "invalid_request"}


def test_only_a_persistent_connection_sends_them() -> None:
    with pytest.raises(Fatal):
        decode({"t": "session_rewind", "id": 1}, "v1_shim")
