"""v2 wire framing (sans-IO): a 4-byte big-endian length, then one msgpack-encoded map.

Bounds, all checked before any value reaches a caller:

- :data:`MAX_FRAME_BYTES` (1 MiB) caps one frame body. A v1 record is at most 65,536 bytes,
  so a frame carrying one plus its envelope fits sixteen times over; a length header above
  the cap is rejected as soon as its 4 bytes arrive, before any of the body is buffered.
- msgpack is unpacked with explicit string/binary/array/map limits, string keys only, no
  extension types (msgpack's Timestamp included) and at most :data:`MAX_FRAME_DEPTH` levels
  of nesting.

Any violation raises :class:`FrameError`, which is fatal for the connection: the decoder
refuses further input, and the frames decoded earlier in the same call travel on the
exception so an adapter can still act on them before closing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgpack

MAX_FRAME_BYTES: Final = 1024 * 1024
MAX_FRAME_ITEMS: Final = 65536  # per array or map
MAX_FRAME_DEPTH: Final = 64
HEADER: Final = struct.Struct(">I")

_LEAF_TYPES: Final = (str, int, float, bool, bytes, type(None))


class FrameError(Exception):
    """The byte stream is not valid v2 framing; close the connection.

    ``decoded`` holds the valid frames that preceded the error in the same ``feed`` call.
    """

    def __init__(self, message: str, decoded: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.decoded: list[dict[str, Any]] = decoded if decoded is not None else []


def encode_frame(obj: Mapping[str, Any]) -> bytes:
    """Header plus msgpack body; :class:`FrameError` if ``obj`` is unencodable or too big."""
    if not isinstance(obj, Mapping):
        raise FrameError("a frame must be a map")
    try:
        body: bytes = msgpack.packb(
            obj if isinstance(obj, dict) else dict(obj), use_bin_type=True, datetime=False
        )
    except (TypeError, ValueError, OverflowError):
        raise FrameError("frame content cannot be encoded") from None
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError("frame exceeds the frame size limit")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Decode one frame body (without its header) under every bound."""
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError("frame exceeds the frame size limit")
    # The length check above is this decoder's buffer bound (``unpackb`` has no
    # max_buffer_size); the per-object limits stop huge declared sizes before allocation.
    try:
        value = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_FRAME_BYTES,
            max_bin_len=MAX_FRAME_BYTES,
            max_array_len=MAX_FRAME_ITEMS,
            max_map_len=MAX_FRAME_ITEMS,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.exceptions.UnpackException):
        raise FrameError("frame body is not valid msgpack within limits") from None
    if not isinstance(value, dict):
        raise FrameError("a frame must be a map")
    _check_tree(value)
    return value


class FrameDecoder:
    """Incremental decoder: feed bytes in any chunking, get complete frames back."""

    __slots__ = ("_buffer", "_expected", "_failed")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._expected: int | None = None  # body length once the header has been read
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return len(self._buffer) + (HEADER.size if self._expected is not None else 0)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        if self._failed:
            raise FrameError("the frame stream already failed")
        self._buffer += data
        frames: list[dict[str, Any]] = []
        offset = 0  # consumed bytes, deleted once at the end (no quadratic re-slicing)
        try:
            while True:
                if self._expected is None:
                    if len(self._buffer) - offset < HEADER.size:
                        break
                    (length,) = HEADER.unpack_from(self._buffer, offset)
                    if length > MAX_FRAME_BYTES:
                        raise FrameError("frame exceeds the frame size limit")
                    offset += HEADER.size
                    self._expected = length
                if len(self._buffer) - offset < self._expected:
                    break
                end = offset + self._expected
                frames.append(decode_body(bytes(self._buffer[offset:end])))
                offset = end
                self._expected = None
        except FrameError as exc:
            self._failed = True
            self._buffer.clear()
            raise FrameError(str(exc), frames) from None
        del self._buffer[:offset]
        return frames

    def eof(self) -> None:
        """Call at end of stream: raises :class:`FrameError` if a frame was cut short."""
        if self._failed:
            raise FrameError("the frame stream already failed")
        if self._buffer or self._expected is not None:
            self._failed = True
            raise FrameError("the stream ended inside a frame")


def _check_tree(root: dict[str, Any]) -> None:
    """Iteratively enforce string keys, plain leaf types and the nesting bound."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node):
                raise FrameError("frame map keys must be strings")
            children: Iterable[Any] = node.values()
        else:
            children = node
        for child in children:
            if isinstance(child, dict | list):
                if depth >= MAX_FRAME_DEPTH:
                    raise FrameError("frame nesting exceeds the depth limit")
                stack.append((child, depth + 1))
            elif not isinstance(child, _LEAF_TYPES):
                raise FrameError("frame contains an unsupported value type")
