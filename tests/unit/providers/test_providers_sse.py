"""The shared SSE parser: framing rules, chunking invariance, bounds and fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magi_code.providers.errors import FailureLabel, ProviderFailure
from magi_code.providers.sse import SSEEvent, SSEParser

TRANSCRIPT = (
    b": keep-alive comment\r\n"
    b"event: message_start\r\n"
    b'data: {"type":"message_start"}\r\n'
    b"\r\n"
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta",\n'
    b'data: "text":"h\xc3\xa9llo"}\n'
    b"id: 7\n"
    b"retry: 100\n"
    b"\n"
    b"data:no-space\r"
    b"\r"
    b"event: ignored-without-data\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent("message_start", '{"type":"message_start"}'),
    SSEEvent("content_block_delta", '{"type":"content_block_delta",\n"text":"héllo"}'),
    SSEEvent("message", "no-space"),
    SSEEvent("message", "[DONE]"),
]


def parse(chunks: list[bytes], **bounds: int) -> list[SSEEvent]:
    parser = SSEParser(**bounds)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.close()


def test_whole_transcript_yields_events_with_types_multiline_data_and_done() -> None:
    events = parse([TRANSCRIPT])
    assert events == EXPECTED
    assert [e.done for e in events] == [False, False, False, True]


def test_byte_by_byte_feeding_gives_the_same_events() -> None:
    chunks = [TRANSCRIPT[i : i + 1] for i in range(len(TRANSCRIPT))]
    assert parse(chunks) == EXPECTED


def test_cr_at_chunk_end_waits_for_a_possible_lf() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r") == []
    assert parser.feed(b"\n") == [SSEEvent("message", "a")]


def test_eof_dispatches_complete_lines_but_drops_an_unterminated_line() -> None:
    assert parse([b"data: whole\n"]) == [SSEEvent("message", "whole")]
    assert parse([b"data: whole\ndata: trunc"]) == [SSEEvent("message", "whole")]
    assert parse([b"data: trunc"]) == []


def test_bracketless_done_is_recognised() -> None:
    assert SSEEvent("message", "DONE").done
    assert not SSEEvent("message", '{"done":true}').done


@pytest.mark.parametrize(
    ("chunks", "bounds"),
    [
        ([b"data: " + b"x" * 200 + b"\n\n"], {"max_line_bytes": 64}),
        ([b"data: " + b"x" * 40] * 5, {"max_line_bytes": 64}),  # never-ending line
        ([b"data: " + b"x" * 40 + b"\n"] * 10, {"max_event_bytes": 256}),
    ],
)
def test_oversized_lines_and_events_are_stream_errors(
    chunks: list[bytes], bounds: dict[str, int]
) -> None:
    with pytest.raises(ProviderFailure) as info:
        parse(chunks, **bounds)
    assert info.value.label is FailureLabel.STREAM_ERROR
    assert str(info.value) == "provider_stream_error"


def test_feed_after_close_is_a_stream_error() -> None:
    parser = SSEParser()
    parser.close()
    with pytest.raises(ProviderFailure):
        parser.feed(b"data: x\n\n")


@settings(max_examples=300)
@given(data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_fuzz_any_bytes_any_chunking_same_events_or_stream_error(
    data: bytes, cuts: list[int]
) -> None:
    """h11-style invariant: parse successfully, or raise the stream error, nothing else;
    and the chunking never changes the outcome."""
    points = sorted({c for c in cuts if c <= len(data)})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    outcomes: list[list[SSEEvent] | str] = []
    for feed in (chunks, [data]):
        try:
            outcomes.append(parse(feed, max_line_bytes=64, max_event_bytes=128))
        except ProviderFailure as failure:
            assert failure.label is FailureLabel.STREAM_ERROR
            outcomes.append("error")
    assert outcomes[0] == outcomes[1]


# Pieces of event streams: whole one-line ``data:`` events (what model providers send) and
# everything else a stream may hold, to join in any order and cut between pieces or
# anywhere.
SSE_PIECES = st.sampled_from(
    [
        b"data: a\n\n",
        b'data: {"x":"\xc3\xa9"}\n\n',
        b"data: " + b"x" * 70 + b"\n\n",  # over the line bound below
        b"data: \xff\n\n",
        b"data: b\n",
        b"data:c\n\n",
        b"event: e\n",
        b": comment\n",
        b"id: 1\n",
        b"\n",
        b"data: ",
    ]
)


@settings(max_examples=500)
@given(
    pieces=st.lists(st.tuples(SSE_PIECES, st.booleans()), max_size=20),
    cuts=st.lists(st.integers(0, 800), max_size=4),
)
def test_fuzz_event_streams_same_events_however_cut(
    pieces: list[tuple[bytes, bool]], cuts: list[int]
) -> None:
    """Whatever the stream, one chunk gives the events (or the stream error) of any other
    chunking: after chosen pieces, at any byte, byte by byte."""
    data = b"".join(piece for piece, _ in pieces)
    by_piece: list[bytes] = []
    for piece, cut_after in pieces:
        if by_piece and not by_piece[-1].endswith(b"|"):
            by_piece[-1] += piece
        else:
            by_piece.append(piece)
        if cut_after:
            by_piece[-1] += b"|"
    by_piece = [chunk.removesuffix(b"|") for chunk in by_piece]
    points = sorted({c for c in cuts if c <= len(data)})
    at_bytes = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    outcomes: list[list[SSEEvent] | str] = []
    for feed in ([data], by_piece, at_bytes, [data[i : i + 1] for i in range(len(data))]):
        try:
            outcomes.append(parse(feed, max_line_bytes=64, max_event_bytes=128))
        except ProviderFailure as failure:
            assert failure.label is FailureLabel.STREAM_ERROR
            outcomes.append("error")
    assert outcomes[1:] == outcomes[:1] * 3


def line_text(forbidden: str, max_size: int) -> st.SearchStrategy[str]:
    chars = st.characters(blacklist_characters=forbidden, blacklist_categories=("Cs",))
    return st.text(alphabet=chars, max_size=max_size)


@settings(max_examples=200)
@given(
    events=st.lists(
        st.tuples(
            line_text("\r\n:", 10),
            st.lists(line_text("\r\n", 20), min_size=1, max_size=3),
        ),
        max_size=6,
    ),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
)
def test_round_trip_of_well_formed_streams(
    events: list[tuple[str, list[str]]], newline: str
) -> None:
    wire = ""
    expected = []
    for name, lines in events:
        wire += f"event: {name}{newline}" if name else ""
        wire += "".join(f"data: {line}{newline}" for line in lines) + newline
        expected.append(SSEEvent(name or "message", "\n".join(lines)))
    raw = wire.encode()
    assert parse([raw]) == expected
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == expected
