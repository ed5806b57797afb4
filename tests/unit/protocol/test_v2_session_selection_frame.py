"""The ``session_selection`` frame (RFC-0002 §6.15): a provider with its model and an
optional reasoning level, or nothing (the settings' again); bad arguments are
``session_selection_error`` ``invalid_request`` without running."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import Fatal, Rejected, SessionSelection, decode

BASE = {"t": "session_selection", "id": 2, "session_id": "ses_1"}


def test_a_selection_is_read() -> None:
    frame = {**BASE, "provider_id": "local", "model_id": "m2", "thinking_level": "high"}
    assert decode(frame, "persistent") == SessionSelection(2, "ses_1", "local", "m2", "high")
    cleared = {**BASE, "provider_id": None, "model_id": None, "thinking_level": None}
    assert decode(cleared, "persistent") == SessionSelection(2, "ses_1", None, None, None)
    assert decode(BASE, "persistent") == SessionSelection(2, "ses_1", None, None, None)


@pytest.mark.parametrize(
    "fields",
    [
        {"provider_id": "local"},
        {"model_id": "m2"},
        {"thinking_level": "high"},
        {"provider_id": "local", "model_id": "m2", "thinking_level": "huge"},
        {"provider_id": "local", "model_id": ""},
        {"provider_id": "local", "model_id": "m" * 257},
        {"provider_id": 1, "model_id": "m2"},
        {"session_id": None},
        {"session_id": 5},
    ],
)
def test_bad_arguments_are_invalid_request(fields: dict[str, Any]) -> None:
    with pytest.raises(Rejected) as rejected:
        decode({**BASE, **fields}, "persistent")
    assert rejected.value.answer == {
        "t": "session_selection_error",
        "id": 2,
        "code": "invalid_request",
    }


def test_only_a_persistent_connection_selects() -> None:
    for role in ("v1_shim", "control"):
        with pytest.raises(Fatal):
            decode(BASE, role)
