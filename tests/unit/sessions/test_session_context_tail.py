"""What a turn's start reads of a long session (issue 36).

A turn's start needs only the records after the latest compaction checkpoint's cutoff.
When the session's window is not cached, the store finds them by searching the window's
bytes and parses only those lines; the context must be exactly what a whole parse gives.
Each context test compares a fresh store (nothing cached: the search) with one whose
cache holds the whole window (a replay parsed it), and counts the lines each decodes.
The search reads the window from its end, a short span first, so a long session's turn
start reads little more than compaction kept, and keeps only that for the next turn,
even where a replay had parsed the whole window. Taking a session's lease (a client
attaches) reads back only to the latest turn's start.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magi_code.sessions import projection
from magi_code.sessions import store as store_module
from magi_code.sessions.records import Record, encode_record
from magi_code.sessions.store import (
    HISTORY,
    LATEST_TURN_BYTES,
    SessionContext,
    SessionStore,
    WriterLease,
)

TS = "2025-01-01T00:00:00.000Z"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "sessions"


@pytest.fixture
def store(root: Path) -> SessionStore:
    return SessionStore(root)


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many lines the window parser decodes (one count per test)."""
    count = [0]
    original: Callable[[bytes, dict[str, str] | None], Record | None] = projection.decode_line

    def counting(line: bytes, strings: dict[str, str] | None = None) -> Record | None:
        count[0] += 1
        return original(line, strings)

    monkeypatch.setattr(projection, "decode_line", counting)
    yield count


def turns(lease: WriterLease, first: int, count: int) -> None:
    for n in range(first, first + count):
        lease.append({"type": "user", "turn_id": f"t{n}", "text": f"question {n}"})
        lease.append({"type": "assistant", "turn_id": f"t{n}", "text": f"answer {n}"})
        lease.append(
            {"type": "terminal", "turn_id": f"t{n}", "status": "completed", "assistant_text": "a"}
        )


def compact(lease: WriterLease, turn_id: str) -> int:
    """A turn whose start compacted: its prompt, then the checkpoint cutting before it."""
    prompt = lease.append({"type": "user", "turn_id": turn_id, "text": "go on"})
    lease.append({"type": "compaction", "summary": "so far", "cutoff_seq": prompt - 1})
    return prompt


def values(context: SessionContext) -> tuple[object, ...]:
    """What a context says (its records are read in place from a window, never equal)."""
    c = context
    return (c.summary, c.cutoff_seq, list(c.records), c.history_cut, c.gap)


def contexts(root: Path, session: str, decoded: list[int]) -> tuple[SessionContext, int]:
    """The context from a fresh store (and the lines it decoded), after checking that a
    store holding the whole parsed window gives the same."""
    whole = SessionStore(root)
    whole.replay(session, None, 1)
    expected = whole.load_context(session)
    decoded[0] = 0
    context = SessionStore(root).load_context(session)
    assert values(context) == values(expected)
    return context, decoded[0]


def lines(root: Path, session: str) -> int:
    return (root / session / HISTORY).read_bytes().count(b"\n")


def test_only_the_lines_after_the_cutoff_are_parsed(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 0, 200)
        prompt = compact(lease, "t200")
        lease.append({"type": "assistant", "turn_id": "t200", "text": "after"})
        turns(lease, 201, 2)
    context, parsed = contexts(root, session, decoded)
    assert context.summary == "so far" and context.cutoff_seq == prompt - 1
    assert [r.seq for r in context.records][:2] == [prompt, prompt + 2]
    assert not context.history_cut and not context.gap
    # The checkpoint's line, the first line it keeps, then the 9 lines from there on.
    assert parsed <= 12 < lines(root, session)


def test_the_latest_checkpoint_counts(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 0, 50)
        compact(lease, "t50")
        turns(lease, 51, 50)
        prompt = compact(lease, "t101")
        turns(lease, 102, 1)
    context, parsed = contexts(root, session, decoded)
    assert context.cutoff_seq == prompt - 1 and next(iter(context.records)).seq == prompt
    assert parsed <= 8


def test_a_rewind_after_the_checkpoint_is_parsed_whole(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 0, 20)
        prompt = compact(lease, "t20")
        turns(lease, 21, 3)
        lease.append({"type": "rewind", "to_seq": prompt - 10})  # takes the checkpoint back
    context, parsed = contexts(root, session, decoded)
    assert context.summary is None and [*context.records][-1].seq == prompt - 10
    assert parsed >= lines(root, session)


def test_a_line_that_reads_like_a_checkpoint(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 0, 30)
        prompt = compact(lease, "t30")
    # A record of a type this build does not know, holding the same bytes in an object.
    fake = {"type": "compaction", "summary": "fake", "cutoff_seq": 1}
    line = {"v": 1, "seq": prompt + 2, "ts": TS, "type": "later", "data": fake}
    with (root / session / HISTORY).open("ab") as fh:
        fh.write(orjson.dumps(line) + b"\n")
    with store.acquire_writer_lease(session) as lease:
        lease.append({"type": "user", "turn_id": "t31", "text": '"type":"rewind" in a prompt'})
    context, parsed = contexts(root, session, decoded)
    assert context.summary == "so far" and next(iter(context.records)).seq == prompt
    assert [r.seq for r in context.records][-1] == prompt + 3
    assert parsed <= 7 < lines(root, session)


@pytest.mark.parametrize(
    ("kept", "peak_kib"),
    [(2, 256), (40, 1200)],  # ~8 KiB after the cutoff (the first read), ~160 KiB (the second)
)
def test_a_long_compacted_session_is_read_from_its_end(
    root: Path, store: SessionStore, session: str, kept: int, peak_kib: int
) -> None:
    text = "x" * 4000
    with (root / session / HISTORY).open("ab") as fh:  # ~1.6 MiB before the checkpoint
        for seq in range(1, 401):
            fh.write(encode_record({"type": "user", "turn_id": f"t{seq}", "text": text}, seq, TS))
    with store.acquire_writer_lease(session) as lease:
        prompt = compact(lease, "t401")
        for _ in range(kept):
            lease.append({"type": "assistant", "turn_id": "t401", "text": text})
    whole = SessionStore(root)
    whole.replay(session, None, 1)
    expected = whole.load_context(session)
    tracemalloc.start()
    try:
        context = SessionStore(root).load_context(session)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert values(context) == values(expected) and context.cutoff_seq == prompt - 1
    # Reading the whole window alone would take ~1.6 MiB.
    assert peak < peak_kib * 1024


def test_a_cutoff_before_the_window_still_says_history_cut(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with (root / session / HISTORY).open("ab") as fh:  # ~2.8 MiB: the window is 2 MiB
        for seq in range(1, 701):
            text = "x" * 4000
            fh.write(encode_record({"type": "user", "turn_id": f"t{seq}", "text": text}, seq, TS))
    with store.acquire_writer_lease(session) as lease:
        lease.append({"type": "compaction", "summary": "early", "cutoff_seq": 10})
    context, _ = contexts(root, session, decoded)
    assert context.history_cut and context.summary == "early"


Step = tuple[str, int]
steps = st.lists(
    st.tuples(st.sampled_from(["turn", "turn", "compact", "rewind", "tool"]), st.integers(1, 12)),
    max_size=30,
)


def test_a_turn_keeps_what_compaction_kept_after_a_replay_parsed_it_all(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with (root / session / HISTORY).open("ab") as fh:  # ~1.6 MiB before the checkpoint
        for seq in range(1, 401):
            text = f"{seq:04d}" + "x" * 4000  # (equal texts would be parsed into one string)
            fh.write(encode_record({"type": "user", "turn_id": f"t{seq}", "text": text}, seq, TS))
    with store.acquire_writer_lease(session) as lease:
        compact(lease, "t401")
    tracemalloc.start()
    try:
        live = SessionStore(root)
        live.replay(session, None, 1)  # the whole window, parsed and projected
        with store.acquire_writer_lease(session) as lease:
            turns(lease, 402, 1)
        decoded[0] = 0
        context = live.load_context(session)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert decoded[0] == 3  # the turn's lines, appended to the cached window
    assert values(context) == values(SessionStore(root).load_context(session))
    # The whole window stays parsed only while a replay needs it: ~1.6 MiB.
    assert held < 256 * 1024
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 403, 1)
    decoded[0] = 0
    context = live.load_context(session)
    assert decoded[0] == 3  # the next turn goes on from what the last one kept
    assert values(context) == values(SessionStore(root).load_context(session))
    decoded[0] = 0
    page = live.replay(session, None, 8)
    assert decoded[0] > 400 and page == SessionStore(root).replay(session, None, 8)


@pytest.mark.parametrize("reads", [store_module.CONTEXT_READS, (150, 600)])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps, st.lists(st.sampled_from(["context", "context", "replay", "none"]), max_size=30))
def test_any_history_gives_the_whole_parse_context(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    reads: tuple[int, ...],
    plan: list[Step],
    reads_between: list[str],
) -> None:
    # With reads of a few lines the search also starts in the middle of a line, and
    # finds the checkpoint, or its cutoff, or neither, in the first read or a later one.
    # A store kept all along is read between the steps (a turn's start, a replay), so
    # its cache goes on from what it kept: every read must equal a fresh store's.
    monkeypatch.setattr(store_module, "CONTEXT_READS", reads)
    root = tmp_path_factory.mktemp("sessions")
    store = SessionStore(root)
    session = store.create()
    live = SessionStore(root)
    with store.acquire_writer_lease(session) as lease:
        for n, (step, size) in enumerate(plan):
            read = reads_between[n] if n < len(reads_between) else "none"
            if read == "context":
                fresh = SessionStore(root).load_context(session)
                assert values(live.load_context(session)) == values(fresh)
            elif read == "replay":
                page = SessionStore(root).replay(session, None, 32)
                assert live.replay(session, None, 32) == page
            if step == "turn":
                turns(lease, n * 100, size % 3 + 1)
            elif step == "compact":
                compact(lease, f"c{n}")
            elif step == "rewind":  # back some records, past a checkpoint or not
                last = lease.append({"type": "user", "turn_id": f"r{n}", "text": "x"})
                lease.append({"type": "rewind", "to_seq": max(1, last - size)})
            else:
                call = {"turn_id": f"c{n}", "call_id": f"k{n}", "name": "compaction"}
                lease.append({"type": "tool_call", **call, "arguments": '{"type":"compaction"}'})
                lease.append({"type": "tool_result", **call, "output": "ok", "is_error": False})
    whole = SessionStore(root)
    whole.replay(session, None, 1)
    expected = values(whole.load_context(session))
    assert values(SessionStore(root).load_context(session)) == expected
    assert values(live.load_context(session)) == expected


def test_taking_the_lease_reads_back_only_to_the_latest_turn(
    root: Path, store: SessionStore, session: str, decoded: list[int]
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 0, 200)
    decoded[0] = 0
    with store.acquire_writer_lease(session) as lease:
        assert store.close_last_interrupted_turn(lease) is None  # its terminal is there
        assert decoded[0] <= 3  # the terminal and the answer before it, then its prompt
        lease.append({"type": "user", "turn_id": "t200", "text": "lost"})
        lease.append({"type": "assistant", "turn_id": "t200", "text": "half"})
    with store.acquire_writer_lease(session) as lease:
        closed = store.close_last_interrupted_turn(lease)
    assert closed is not None and (closed.turn_id, closed.status) == ("t200", "failed")


def test_a_latest_turn_longer_than_the_first_read_is_still_closed(
    store: SessionStore, session: str
) -> None:
    with store.acquire_writer_lease(session) as lease:
        turns(lease, 0, 3)
        lease.append({"type": "user", "turn_id": "long", "text": "write a lot"})
        for _ in range(4):  # past the first read from the end, within the window
            text = "x" * (LATEST_TURN_BYTES // 2)
            lease.append({"type": "assistant", "turn_id": "long", "text": text, "continued": True})
    with store.acquire_writer_lease(session) as lease:
        closed = store.close_last_interrupted_turn(lease)
    assert closed is not None and (closed.turn_id, closed.status) == ("long", "failed")
