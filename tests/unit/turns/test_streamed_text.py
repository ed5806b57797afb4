"""The increment policy that makes streamed assistant text durable while it streams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from magi_code.turns.streamed import INCREMENT_BYTES, INCREMENT_SECONDS, StreamedText


class Store:
    """Records appended texts; ``gate`` (when set) holds each append until released."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bool]] = []  # (text, continued)
        self.started = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate: asyncio.Event | None = None
        self.failures: list[BaseException] = []

    @property
    def texts(self) -> list[str]:
        """The texts written (an empty record only ends a message)."""
        return [text for text, _ in self.records if text]

    async def append(self, text: str, continued: bool) -> None:
        self.started += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)  # an append takes a while (off-loop in real life)
            if self.failures:
                raise self.failures.pop(0)
            self.records.append((text, continued))
        finally:
            self.in_flight -= 1


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_the_defaults_are_four_kib_and_a_quarter_second() -> None:
    assert (INCREMENT_BYTES, INCREMENT_SECONDS) == (4096, 0.25)


async def test_size_starts_an_increment_at_once() -> None:
    store = Store()
    streamed = StreamedText(store.append, interval=60)
    streamed.add("a" * 4000)
    await asyncio.sleep(0.01)
    assert store.texts == []
    streamed.add("é" * 48)  # 4096 UTF-8 bytes in all: bytes count, not characters
    await until(lambda: store.texts)
    assert store.texts == ["a" * 4000 + "é" * 48]
    assert streamed.unsaved == ""


async def test_time_flushes_a_stalled_stream_without_another_delta() -> None:
    store = Store()
    streamed = StreamedText(store.append, interval=0.05)
    streamed.add("Hel")
    streamed.add("lo")
    assert store.started == 0
    await asyncio.sleep(0.02)
    assert store.started == 0  # younger than the window: not yet
    await until(lambda: store.texts, timeout=1.0)
    assert store.texts == ["Hello"]
    await asyncio.sleep(0.1)
    assert store.texts == ["Hello"]  # nothing unsaved: no empty increments


async def test_one_append_in_flight_and_text_arriving_meanwhile_is_the_next_increment() -> None:
    store = Store()
    store.gate = asyncio.Event()
    streamed = StreamedText(store.append, max_bytes=8, interval=60)
    streamed.add("12345678")
    await until(lambda: store.started == 1)
    for piece in ("abcdefgh", "ijklmnop", "q"):
        streamed.add(piece)
    await asyncio.sleep(0.01)
    assert store.started == 1  # the first is still being written
    assert streamed.unsaved == "abcdefghijklmnopq"
    store.gate.set()
    await until(lambda: len(store.texts) == 2)
    assert store.texts == ["12345678", "abcdefghijklmnopq"]
    assert store.max_in_flight == 1


async def test_settle_writes_the_rest_after_the_append_in_flight_in_order() -> None:
    store = Store()
    store.gate = asyncio.Event()
    streamed = StreamedText(store.append, max_bytes=4, interval=60)
    streamed.add("abcd")
    await until(lambda: store.started == 1)
    streamed.add("ef")
    settling = asyncio.create_task(streamed.settle())
    await asyncio.sleep(0.01)
    assert not settling.done()
    store.gate.set()
    await settling
    assert store.texts == ["abcd", "ef"]
    assert "".join(store.texts) == streamed.text == "abcdef"
    await streamed.settle()  # again: nothing left, nothing written twice
    streamed.add("late")  # after settling no increment starts by itself
    await asyncio.sleep(0.01)
    assert store.texts == ["abcd", "ef"]
    assert streamed.appends == 2


async def test_a_steady_slow_stream_costs_one_append_per_window() -> None:
    store = Store()
    streamed = StreamedText(store.append, interval=0.1)
    sent = []
    loop = asyncio.get_running_loop()
    began = loop.time()
    for i in range(50):  # ~1 s of one small delta every 20 ms
        sent.append(f"w{i} ")
        streamed.add(sent[-1])
        await asyncio.sleep(0.02)
    windows = (loop.time() - began) / 0.1  # more on a loaded machine, whose sleeps run long
    await streamed.settle()
    assert "".join(store.texts) == "".join(sent)
    # At most one append per window (+ the settle), and appends while it streams.
    assert 5 <= len(store.texts) <= windows + 2, (len(store.texts), windows)
    assert store.max_in_flight == 1


async def test_a_failed_increment_stops_increments_and_settle_retries_its_text() -> None:
    store = Store()
    store.failures.append(OSError("disk full"))
    streamed = StreamedText(store.append, max_bytes=2, interval=60)
    streamed.add("ab")
    await until(lambda: store.started == 1 and store.in_flight == 0)
    streamed.add("cd")
    await asyncio.sleep(0.01)
    assert store.started == 1  # no more background increments after a failure
    assert streamed.unsaved == "abcd"
    await streamed.settle()
    assert store.texts == ["abcd"]


async def test_settle_raises_what_the_store_raises_and_keeps_the_text_unsaved() -> None:
    store = Store()
    store.failures.append(OSError("disk full"))
    streamed = StreamedText(store.append, interval=60)
    streamed.add("text")
    with pytest.raises(OSError):
        await streamed.settle()
    assert streamed.unsaved == "text"
    await streamed.settle()  # the turn's end tries again
    assert store.texts == ["text"]


async def test_a_cancelled_settle_never_interrupts_its_append_nor_repeats_it() -> None:
    store = Store()
    store.gate = asyncio.Event()
    streamed = StreamedText(store.append, interval=60)
    streamed.add("partial")
    settling = asyncio.create_task(streamed.settle())
    await until(lambda: store.started == 1)
    settling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settling
    store.gate.set()
    await streamed.settle()  # the turn's end: waits for the append, writes nothing again
    assert store.texts == ["partial"]


async def test_without_increments_or_a_store_only_settle_writes() -> None:
    store = Store()
    streamed = StreamedText(store.append, incremental=False, max_bytes=1, interval=0)
    streamed.add("no increments")
    await asyncio.sleep(0.02)
    assert store.started == 0
    await streamed.settle()
    assert store.texts == ["no increments"]

    silent = StreamedText(None, max_bytes=1, interval=0)  # a subagent persists nothing
    silent.add("child text")
    await asyncio.sleep(0.01)
    await silent.settle()
    assert silent.text == "child text"


async def test_increments_continue_one_message_and_settle_ends_it() -> None:
    store = Store()
    streamed = StreamedText(store.append, max_bytes=4)
    streamed.add("abcd")
    await until(lambda: store.records)
    streamed.add("ef")
    await streamed.settle()
    # The increment leaves the message open; the last record ends it.
    assert store.records == [("abcd", True), ("ef", False)]
    ended = Store()
    streamed = StreamedText(ended.append, max_bytes=4)
    streamed.add("wxyz")
    await until(lambda: ended.records)
    await streamed.settle()  # nothing left: an empty record only ends the message
    assert ended.records == [("wxyz", True), ("", False)]
