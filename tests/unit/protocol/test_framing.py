"""LineFramer: LF/CRLF, the record bound, discard-through-newline, chunking independence."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magi_code.protocol.framing import TOO_LARGE, LineFramer


def frames_of(chunks: list[bytes], limit: int = 16) -> list[object]:
    framer = LineFramer(limit)
    out: list[object] = []
    for chunk in chunks:
        out.extend(framer.feed(chunk))
    out.extend(framer.eof())
    return out


def test_lf_and_crlf_records_are_split_and_cr_stripped() -> None:
    assert frames_of([b"a\nb\r\n\n"]) == [b"a", b"b", b""]


def test_record_including_newline_at_limit_is_kept() -> None:
    assert frames_of([b"x" * 15 + b"\n"]) == [b"x" * 15]


def test_over_limit_record_is_discarded_through_its_newline_once() -> None:
    assert frames_of([b"x" * 16 + b"\nok\n"]) == [TOO_LARGE, b"ok"]
    assert frames_of([b"x" * 10, b"y" * 10, b"z" * 100, b"\nok\n"]) == [TOO_LARGE, b"ok"]


def test_unterminated_final_record_is_flushed_at_eof() -> None:
    assert frames_of([b"a\nlast"]) == [b"a", b"last"]
    assert frames_of([b"a\n" + b"q" * 40]) == [b"a", TOO_LARGE]


@given(st.lists(st.binary(max_size=40), max_size=12), st.data())
def test_framing_does_not_depend_on_chunking(parts: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert frames_of(chunks) == frames_of([stream])
    assert frames_of([bytes([b]) for b in stream]) == frames_of([stream])


@given(st.binary(max_size=400))
def test_every_newline_ends_exactly_one_frame(stream: bytes) -> None:
    frames = frames_of([stream])
    expected = stream.count(b"\n") + (0 if stream.endswith(b"\n") or not stream else 1)
    assert len(frames) == expected
    assert all(f is TOO_LARGE or len(f) < 16 for f in frames)
