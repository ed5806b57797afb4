"""Daemon frames as a client reads them (RFC-0002): the frame type is validated once,
and the frames the handshake and the shim act on become typed values."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import (
    SERVER_FRAMES,
    Code,
    End,
    Next,
    Output,
    Refused,
    decode_refused,
    decode_shim_frame,
    error,
    refused,
    server_frame_type,
)


def test_the_type_of_a_daemon_frame_is_one_the_daemon_sends() -> None:
    assert server_frame_type(refused(Code.DRAINING)) == "refused"
    assert server_frame_type(error(Code.FRAMING_ERROR)) == "error"
    assert all(server_frame_type({"t": kind}) == kind for kind in SERVER_FRAMES)
    # a client frame, an unknown name, a non-string and no type at all
    for frame in ({"t": "hello"}, {"t": "surprise"}, {"t": 7}, {}):
        assert server_frame_type(frame) is None


def test_a_refusal_names_its_code() -> None:
    assert decode_refused(refused(Code.TOOL_PROCESS)) == Refused("tool_process")
    assert decode_refused({"t": "refused", "code": 3}) == Refused(None)
    assert decode_refused({"t": "refused"}) == Refused(None)
    assert decode_refused({"t": "welcome", "code": "draining"}) is None


def test_the_frames_a_shim_reads() -> None:
    failures = [{"turn_id": "t1", "failure": "provider_error"}]
    frame = {"t": "output", "seq": 4, "data": b"{}\n", "failures": failures, "answers": True}
    assert decode_shim_frame(frame) == Output(b"{}\n", 4, failures, True)
    assert decode_shim_frame({"t": "output", "seq": 5, "data": b""}) == Output(b"", 5, None, False)
    assert decode_shim_frame({"t": "next"}) == Next()
    assert decode_shim_frame({"t": "end", "status": "ok"}) == End("ok", None)
    assert decode_shim_frame({"t": "end", "status": "output_error", "detail": "x"}) == End(
        "output_error", "x"
    )
    assert decode_shim_frame({"t": "end", "status": 1, "detail": ["x"]}) == End(None, None)


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "output", "seq": 1, "data": "not bytes"},
        {"t": "output", "seq": 1},
        {"t": "message", "message": {}},  # a persistent client's frame
        {"t": "surprise"},
        {},
    ],
)
def test_any_other_frame_is_none_to_a_shim(frame: dict[str, Any]) -> None:
    assert decode_shim_frame(frame) is None
