"""The ``steer`` frame (RFC-0002 §6.10): a persistent client's only; bad arguments are
answered ``steer_error`` ``invalid_request`` without running."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.limits import MAX_STRING_BYTES
from magi_code.protocol.v2 import Fatal, Rejected, Steer, decode


def test_a_steer_frame_is_read() -> None:
    parsed = decode(
        {"t": "steer", "id": 3, "turn_id": "turn_1", "text": "and the tests"}, "persistent"
    )
    assert parsed == Steer(3, "turn_1", "and the tests")
    longest = "é" * (MAX_STRING_BYTES // 2)
    assert isinstance(
        decode({"t": "steer", "id": 1, "turn_id": "t", "text": longest}, "persistent"), Steer
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"turn_id": "t"},
        {"turn_id": "t", "text": ""},
        {"turn_id": "t", "text": " \n"},
        {"turn_id": "t", "text": 5},
        {"turn_id": "t", "text": "x" * (MAX_STRING_BYTES + 1)},
        {"text": "x"},
        {"turn_id": "", "text": "x"},
        {"turn_id": "t" * 129, "text": "x"},
        {"turn_id": 1, "text": "x"},
    ],
)
def test_bad_arguments_are_invalid_request(fields: dict[str, Any]) -> None:
    with pytest.raises(Rejected) as rejected:
        decode({"t": "steer", "id": 9, **fields}, "persistent")
    assert rejected.value.answer == {"t": "steer_error", "id": 9, "code": "invalid_request"}


def test_only_a_persistent_connection_steers() -> None:
    for role in ("v1_shim", "control"):
        with pytest.raises(Fatal):
            decode({"t": "steer", "id": 1, "turn_id": "t", "text": "x"}, role)
