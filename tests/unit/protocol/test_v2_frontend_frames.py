"""The hello options ``tool_details`` and ``editor_files`` and the ``fs_result`` frame
(RFC-0002 §3, §6.8): what a persistent client may ask for, and how its answers are read."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import (
    MAX_FS_ERROR_CHARS,
    Code,
    Fatal,
    FsResult,
    Launch,
    decode,
    hello,
    parse_hello,
)

LAUNCH = Launch("/home/user/.magi-code", "/work/project", {})


def frame(role: str, **options: Any) -> dict[str, Any]:
    return hello(role, LAUNCH, "test", "0", options)  # type: ignore[arg-type]


def test_a_persistent_client_asks_for_details_and_editor_files() -> None:
    parsed = parse_hello(frame("persistent", tool_details=True, editor_files=["read", "write"]))
    assert parsed.tool_details is True and parsed.editor_files == {"read", "write"}
    plain = parse_hello(frame("persistent"))
    assert plain.tool_details is False and plain.editor_files == frozenset()
    # Another role gets neither.
    shim = parse_hello(frame("v1_shim", tool_details=True, editor_files=["read"]))
    assert shim.tool_details is False and shim.editor_files == frozenset()


@pytest.mark.parametrize(
    "options",
    [
        {"tool_details": 1},
        {"tool_details": "yes"},
        {"editor_files": "read"},
        {"editor_files": ["read", "delete"]},
        {"editor_files": [{"read": True}]},
    ],
)
def test_bad_options_refuse_the_hello(options: dict[str, Any]) -> None:
    with pytest.raises(Fatal) as refused:
        parse_hello(frame("persistent", **options))
    assert refused.value.code is Code.INVALID_HELLO


def test_fs_result_carries_text_or_a_bounded_error() -> None:
    read = decode({"t": "fs_result", "fs_id": "fs_1", "content": "text"}, "persistent")
    assert read == FsResult("fs_1", "text", None)
    written = decode({"t": "fs_result", "fs_id": "fs_2"}, "persistent")
    assert written == FsResult("fs_2", None, None)
    failed = decode({"t": "fs_result", "fs_id": "fs_3", "error": "x" * 5000}, "persistent")
    assert isinstance(failed, FsResult) and failed.error == "x" * MAX_FS_ERROR_CHARS


@pytest.mark.parametrize(
    "bad",
    [
        {"t": "fs_result"},
        {"t": "fs_result", "fs_id": ""},
        {"t": "fs_result", "fs_id": 7},
        {"t": "fs_result", "fs_id": "fs_1", "content": b"bytes"},
        {"t": "fs_result", "fs_id": "fs_1", "error": 3},
    ],
)
def test_a_malformed_fs_result_is_a_protocol_error(bad: dict[str, Any]) -> None:
    with pytest.raises(Fatal) as fatal:
        decode(bad, "persistent")
    assert fatal.value.code is Code.PROTOCOL_ERROR


def test_fs_result_belongs_to_the_persistent_role() -> None:
    with pytest.raises(Fatal) as fatal:
        decode({"t": "fs_result", "fs_id": "fs_1"}, "v1_shim")
    assert fatal.value.code is Code.PROTOCOL_ERROR
