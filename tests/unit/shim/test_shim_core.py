"""The shim's bridging rules, fed directly (the core is sans-IO): the window, the order of
acknowledgements and records, EOF, output failure and exit status."""

from __future__ import annotations

from typing import Any

from magi_code.protocol.limits import MAX_RECORD_BYTES
from magi_code.shim.core import WINDOW_BYTES, WINDOW_RECORDS, ShimCore


def _lines(count: int, prefix: str = "r") -> bytes:
    return b"".join(f"{prefix}{i}\n".encode() for i in range(count))


def _kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["t"] for frame in frames]


def _answer(seq: int, data: bytes = b"x\n") -> dict[str, Any]:
    return {"t": "output", "seq": seq, "data": data, "answers": True}


def test_records_are_forwarded_up_to_the_window_then_one_per_answer() -> None:
    core = ShimCore()
    core.feed_stdin(_lines(WINDOW_RECORDS + 5))
    sent = core.take_frames()
    assert [f["data"] for f in sent] == [f"r{i}".encode() for i in range(WINDOW_RECORDS)]
    assert core.in_flight == WINDOW_RECORDS and not core.wants_stdin  # 5 wait in the shim
    core.feed_frames([{"t": "next"}, _answer(1)])
    assert core.take_frames() == []  # the write comes first
    assert core.needs_write and core.stdout == b"x\n"
    core.wrote(True)
    assert core.take_frames() == [
        {"t": "written", "seq": 1},
        {"t": "record", "data": f"r{WINDOW_RECORDS}".encode()},
        {"t": "record", "data": f"r{WINDOW_RECORDS + 1}".encode()},
    ]
    assert core.in_flight == WINDOW_RECORDS


def test_output_that_answers_nothing_frees_no_slot_but_is_acknowledged() -> None:
    core = ShimCore()
    core.feed_stdin(_lines(WINDOW_RECORDS + 1))
    core.take_frames()
    core.feed_frames([{"t": "output", "seq": 7, "data": b"event\n"}])
    core.wrote(True)
    assert core.take_frames() == [{"t": "written", "seq": 7}]
    assert core.in_flight == WINDOW_RECORDS


def test_the_window_also_bounds_bytes_but_always_admits_one_record() -> None:
    core = ShimCore()
    big = b"{" + b" " * (MAX_RECORD_BYTES - 3) + b"}\n"
    core.feed_stdin(big * 20)
    admitted = len(core.take_frames())
    assert 1 < admitted < 20 and admitted * MAX_RECORD_BYTES <= WINDOW_BYTES
    assert ShimCore(window_bytes=1).feed_stdin(big * 2) is None


def test_one_record_over_a_byte_window_smaller_than_itself_is_still_sent() -> None:
    core = ShimCore(window_bytes=1)
    core.feed_stdin(b"abc\ndef\n")
    assert _kinds(core.take_frames()) == ["record"]
    core.feed_frames([{"t": "next"}])
    assert core.take_frames() == [{"t": "record", "data": b"def"}]


def test_framing_is_v1s_crlf_bound_and_oversize_in_place() -> None:
    core = ShimCore()
    core.feed_stdin(b"a\r\n" + b"x" * (MAX_RECORD_BYTES + 10) + b"\nb\n" + b"tail")
    assert core.take_frames() == [
        {"t": "record", "data": b"a"},
        {"t": "oversize"},
        {"t": "record", "data": b"b"},
    ]
    core.feed_stdin(b"")  # an unterminated last record still counts, then eof
    assert core.take_frames() == [{"t": "record", "data": b"tail"}, {"t": "eof"}]


def test_eof_follows_every_record_even_those_waiting_for_the_window() -> None:
    core = ShimCore(window=2)
    core.feed_stdin(_lines(4))
    core.feed_stdin(b"")
    assert _kinds(core.take_frames()) == ["record", "record"]
    core.feed_frames([{"t": "next"}, {"t": "next"}])
    assert _kinds(core.take_frames()) == ["record", "record", "eof"]
    core.feed_frames([{"t": "next"}, {"t": "next"}, {"t": "end", "status": "ok"}])
    assert core.finished and core.exit_code == 0


def test_a_signal_stops_input_like_eof() -> None:
    core = ShimCore()
    core.feed_stdin(b"a\npartial")
    core.stop()
    assert core.take_frames() == [
        {"t": "record", "data": b"a"},
        {"t": "record", "data": b"partial"},
        {"t": "eof"},
    ]
    assert not core.wants_stdin


def test_output_failure_is_reported_for_every_later_batch_and_exits_1() -> None:
    core = ShimCore(window=1)
    core.feed_stdin(_lines(3))
    core.take_frames()
    core.feed_frames([_answer(1)])
    core.wrote(False)
    assert core.take_frames() == [{"t": "output_failed"}, {"t": "eof"}]
    assert core.take_diagnostics() == ["output error: stdout closed; stopping"]
    core.feed_frames([{"t": "output", "seq": 2, "data": b"late\n"}])
    assert core.stdout == b""  # nothing more is written
    core.wrote(True)
    assert core.take_frames() == [{"t": "output_failed"}]
    core.feed_frames([{"t": "end", "status": "ok"}])
    assert core.exit_code == 1


def test_output_that_comes_with_end_is_written_before_the_exit() -> None:
    core = ShimCore()
    core.feed_stdin(b"")
    core.feed_frames([_answer(3, b"last\n"), {"t": "end", "status": "ok"}])
    assert not core.finished and core.stdout == b"last\n"
    core.wrote(False)
    assert core.finished and core.exit_code == 1


def test_end_statuses_and_lost_connections() -> None:
    core = ShimCore()
    core.feed_frames([{"t": "end", "status": "output_error", "detail": "too big"}])
    assert core.exit_code == 1
    assert core.take_diagnostics() == ["output error: too big; stopping"]
    for frames in ([{"t": "surprise"}], [{"t": "output", "seq": 1, "data": "not bytes"}]):
        lost = ShimCore()
        lost.feed_frames(frames)
        assert lost.exit_code == 1
        assert lost.take_diagnostics() == ["lost the connection to the daemon; stopping"]
    closed = ShimCore()
    closed.lost()
    closed.feed_frames([{"t": "end", "status": "ok"}])  # after the loss: ignored
    assert closed.exit_code == 1
