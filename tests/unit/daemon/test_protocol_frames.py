"""v2 frame codec: round trips under any chunking, bounds, and hostile input."""

from __future__ import annotations

import itertools
import math
import struct
import tracemalloc
from types import MappingProxyType
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magi_code.protocol.frames import (
    MAX_FRAME_BYTES,
    MAX_FRAME_DEPTH,
    FrameDecoder,
    FrameError,
    decode_body,
    encode_frame,
)
from magi_code.protocol.limits import MAX_RECORD_BYTES

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
frames_strategy = st.lists(st.dictionaries(st.text(max_size=10), values, max_size=6), max_size=6)


def frame_of(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=100)
@given(frames=frames_strategy, cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_round_trip_under_any_chunking(frames: list[dict[str, Any]], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(f) for f in frames)
    decoder = FrameDecoder()
    out: list[dict[str, Any]] = []
    for chunk in chunked(stream, cuts):
        out.extend(decoder.feed(chunk))
    decoder.eof()
    assert out == frames
    assert decoder.buffered == 0


@settings(max_examples=300)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_random_bytes_only_ever_raise_frame_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder()
    try:
        for chunk in chunked(data, cuts):
            for frame in decoder.feed(chunk):
                assert isinstance(frame, dict)
        decoder.eof()
    except FrameError:
        pass


@settings(max_examples=300)
@given(body=st.binary(max_size=200))
def test_random_bodies_with_valid_headers_only_raise_frame_error(body: bytes) -> None:
    try:
        frames = FrameDecoder().feed(frame_of(body))
    except FrameError:
        return
    assert len(frames) == 1 and isinstance(frames[0], dict)


@pytest.mark.parametrize("length", [MAX_FRAME_BYTES + 1, 2**32 - 1])
def test_oversize_length_is_rejected_from_the_header_alone(length: int) -> None:
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with pytest.raises(FrameError):
            decoder.feed(struct.pack(">I", length))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert decoder.buffered == 0


def test_frame_at_the_bound_is_accepted_and_one_byte_more_is_not() -> None:
    overhead = len(encode_frame({"b": b""})) - 4
    # bin32 header is 5 bytes vs bin8's 2: grow the payload to the exact limit.
    payload = b"x" * (MAX_FRAME_BYTES - overhead - 3)
    wire = encode_frame({"b": payload})
    assert len(wire) - 4 == MAX_FRAME_BYTES
    assert FrameDecoder().feed(wire) == [{"b": payload}]
    with pytest.raises(FrameError):
        encode_frame({"b": payload + b"x"})


def test_a_full_v1_record_fits_with_envelope() -> None:
    record = "r" * MAX_RECORD_BYTES
    frame = {"type": "v1", "connection": "c" * 128, "record": record}
    assert FrameDecoder().feed(encode_frame(frame)) == [frame]


@pytest.mark.parametrize(
    "value",
    [[1, 2], "text", 7, None, b"raw"],
)
def test_non_map_top_level_is_rejected(value: object) -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame_of(msgpack.packb(value)))


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb({"e": msgpack.ExtType(5, b"x")}),
        msgpack.packb({"t": msgpack.Timestamp(1, 0)}),
        msgpack.packb({1: "int key"}),
        msgpack.packb({b"k": "bytes key"}, use_bin_type=True),
        msgpack.packb({"a": 1}) + msgpack.packb({"b": 2}),  # trailing data inside one frame
        b"",
        b"\x81\xa1a",  # map truncated inside the body
        b"\x81\xa2\xff\xfe\x01",  # invalid UTF-8 in a str
        b"\x81\xa1a\xdd\xff\xff\xff\xff",  # array header claiming 4G items
        b"\x81\xa1a\xdf\xff\xff\xff\xff",  # map header claiming 4G entries
    ],
)
def test_hostile_bodies_are_rejected(body: bytes) -> None:
    with pytest.raises(FrameError):
        decode_body(body)


def nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    root = node
    for _ in range(depth - 1):
        child: dict[str, Any] = {}
        node["n"] = child
        node = child
    return root


def test_depth_bound() -> None:
    assert decode_body(msgpack.packb(nested(MAX_FRAME_DEPTH))) == nested(MAX_FRAME_DEPTH)
    with pytest.raises(FrameError, match="depth"):
        decode_body(msgpack.packb(nested(MAX_FRAME_DEPTH + 1)))
    deep_lists: Any = 0
    for _ in range(500):
        deep_lists = [deep_lists]
    with pytest.raises(FrameError):
        decode_body(msgpack.packb({"l": deep_lists}))


def test_error_poisons_the_decoder_and_carries_earlier_frames() -> None:
    good = encode_frame({"op": "cancel"})
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(good + frame_of(b"\xc1"))  # 0xc1 is never valid msgpack
    assert info.value.decoded == [{"op": "cancel"}]
    with pytest.raises(FrameError):
        decoder.feed(good)


def test_eof_inside_a_frame_is_an_error() -> None:
    wire = encode_frame({"a": 1})
    decoder = FrameDecoder()
    assert decoder.feed(wire[:-1]) == []
    assert decoder.buffered == len(wire) - 1
    with pytest.raises(FrameError):
        decoder.eof()
    header_only = FrameDecoder()
    header_only.feed(wire[:4])
    with pytest.raises(FrameError):
        header_only.eof()


def test_many_frames_in_one_chunk() -> None:
    frames = [{"i": i} for i in range(5000)]
    assert FrameDecoder().feed(b"".join(encode_frame(f) for f in frames)) == frames


@pytest.mark.parametrize(
    "obj",
    [{"s": {1, 2}}, {"o": object()}, {"big": 2**64}, {"nan-ok": math.nan, "x": object()}],
)
def test_unencodable_values_raise_frame_error_without_echoing_data(obj: dict[str, Any]) -> None:
    with pytest.raises(FrameError) as info:
        encode_frame(obj)
    assert "big" not in str(info.value) and "object" not in str(info.value)


def test_encode_requires_a_mapping() -> None:
    with pytest.raises(FrameError):
        encode_frame([("a", 1)])  # type: ignore[arg-type]


def test_any_mapping_encodes() -> None:
    assert FrameDecoder().feed(encode_frame(MappingProxyType({"a": [1]}))) == [{"a": [1]}]
