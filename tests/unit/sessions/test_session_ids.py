"""Session ID generation and validation (spec: IDs are opaque, <=128 bytes, validated
by the server before path resolution)."""

from __future__ import annotations

import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.ids import new_session_id, validate_session_id


def test_generated_ids_are_valid_unique_and_sort_by_creation_time() -> None:
    ids = [new_session_id() for _ in range(200)]
    assert len(set(ids)) == len(ids)
    for value in ids:
        assert validate_session_id(value) == value
        assert value.startswith("ses_") and len(value) == 30
    # The leading 10 characters encode the millisecond clock and never go backwards.
    stamps = [value[4:14] for value in ids]
    assert stamps == sorted(stamps)


@pytest.mark.parametrize(
    "value",
    ["ses_abc", "A", "a" * 128, "0-_x", "with_underscore", "UPPER-lower-09"],
)
def test_safe_ids_are_accepted(value: str) -> None:
    assert validate_session_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "../x",
        "..",
        ".",
        "a/b",
        "a\\b",
        ".hidden",
        "-leading-dash",
        "a" * 129,
        "sés",
        "ses\u2028x",
        "a b",
        "a\x00b",
        "a\nb",
        "~",
        "x.json",
        None,
        12,
        b"ses_abc",
        ["ses_abc"],
    ],
)
def test_unsafe_or_malformed_ids_are_rejected(value: object) -> None:
    with pytest.raises(ServiceError) as info:
        validate_session_id(value)
    assert info.value.code is ErrorCode.INVALID_SESSION_ID
    assert str(info.value) == "invalid_session_id"
