"""The embedded stdio adapter's output path: each record is handled only once the answer
to the one before it is written, queued batches leave in few writes, in order, and each
batch is settled (its request IDs released) only after its write.

The coordinator and domains are the real ones (``build_coordinator`` on a temporary
home); the adapter's own functions (``pump_input``, ``write_loop``) run as in
``serve_stdio``. Only the byte streams differ: real pipes where the test reads what was
written, and small in-memory streams where it must hold a write open or see each call.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.composition import build_coordinator
from magi_code.core.coordinator import Connection, ServiceCoordinator
from magi_code.core.output import Batch, Output
from magi_code.protocol import envelope
from magi_code.protocol.limits import MAX_STRING_BYTES
from magi_code.stdio.adapter import (
    StopSignal,
    open_reader,
    open_writer,
    pump_input,
    write_loop,
)
from magi_code.storage.launch import LaunchContext

WAIT = 10.0


def _line(request_id: str, method: str = "status", payload: Any = None) -> bytes:
    return orjson.dumps(envelope.request(request_id, method, payload or {})) + b"\n"


def _message(request_id: str, text: str = "ok") -> dict[str, Any]:
    identity = envelope.Identity(request_id, None, "status")
    return envelope.response(identity, {"text": text})


class Chunks:
    """Input handed over in the chunks a test chooses; ``b""`` is EOF."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()

    def push(self, data: bytes) -> None:
        self._queue.put_nowait(data)

    async def read(self, n: int) -> bytes:
        return await self._queue.get()


class Recorder:
    """Output that records every write call; ``hold`` keeps a write open until released."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail: type[BaseException] | None = None

    async def write(self, data: bytes) -> None:
        await self.hold.wait()
        if self.fail is not None:
            raise self.fail()
        self.writes.append(data)

    def lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in b"".join(self.writes).splitlines()]


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[tuple[ServiceCoordinator, Connection]]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    project = tmp_path / "project"
    project.mkdir()
    ctx = LaunchContext(home, project, {"MC_HOME": str(home)})
    coordinator = await build_coordinator(ctx)
    conn = coordinator.open_connection(ctx)
    init = envelope.request("init", "initialize", {"supported_protocol_versions": [1]})
    batch = await coordinator.handle_record(conn, orjson.dumps(init))
    assert batch is not None
    assert await conn.output.get() is batch
    batch.written()
    yield coordinator, conn
    await coordinator.close_connection(conn)


async def _settled(condition: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0)


async def test_queued_batches_leave_in_one_write_and_settle_after_it() -> None:
    output = Output()
    writer = Recorder()
    writer.hold.clear()
    released: list[str] = []

    def batch(request_id: str) -> Batch:
        return Batch([_message(request_id)], after_write=[lambda: released.append(request_id)])

    batches = [batch(f"r{i}") for i in range(5)]
    for batch in batches:
        output.put(batch)
    task = asyncio.create_task(write_loop(output, writer))
    await asyncio.sleep(0.01)
    assert released == [] and not any(b.done.is_set() for b in batches)  # write still open
    writer.hold.set()
    await _settled(lambda: all(b.done.is_set() for b in batches))
    assert released == [f"r{i}" for i in range(5)]
    assert len(writer.writes) == 1
    assert [m["request_id"] for m in writer.lines()] == [f"r{i}" for i in range(5)]
    output.finish()
    assert await asyncio.wait_for(task, WAIT) is True


async def test_a_batch_that_cannot_be_encoded_stops_output_after_the_ones_before_it() -> None:
    output = Output()
    writer = Recorder()
    bad = _message("bad", "x" * (MAX_STRING_BYTES + 1))
    batches = [Batch([_message("a")]), Batch([_message("b")]), Batch([bad]), Batch([_message("c")])]
    for batch in batches:
        output.put(batch)
    assert await asyncio.wait_for(write_loop(output, writer), WAIT) is False
    # The batches before the bad one were written (together); nothing from it on.
    assert [m["request_id"] for m in writer.lines()] == ["a", "b"]
    assert len(writer.writes) == 1
    assert all(b.done.is_set() for b in batches)  # every batch settled, written or not
    assert output.closed
    late = output.put(Batch([_message("late")]))
    assert late.done.is_set()


async def test_a_batch_whose_whole_message_fails_is_not_written_at_all() -> None:
    output = Output()
    writer = Recorder()
    ok = Batch([_message("ok")])
    # One message of the batch is fine, the next is not: nothing of the batch goes out.
    mixed = Batch([_message("fine"), _message("bad", "x" * (MAX_STRING_BYTES + 1))])
    output.put(ok)
    output.put(mixed)
    assert await asyncio.wait_for(write_loop(output, writer), WAIT) is False
    assert [m["request_id"] for m in writer.lines()] == ["ok"]
    assert ok.done.is_set() and mixed.done.is_set()


async def test_a_failed_write_settles_every_batch_it_carried_and_stops() -> None:
    output = Output()
    writer = Recorder()
    writer.fail = BrokenPipeError
    batches = [Batch([_message(f"r{i}")]) for i in range(3)]
    for batch in batches:
        output.put(batch)
    assert await asyncio.wait_for(write_loop(output, writer), WAIT) is False
    assert writer.writes == []
    assert all(b.done.is_set() for b in batches)
    assert output.closed


async def test_pipelined_requests_are_answered_in_order_through_real_pipes(
    core: tuple[ServiceCoordinator, Connection],
) -> None:
    coordinator, conn = core
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    try:
        reader = await open_reader(in_read)
        pipe_writer = await open_writer(out_write)
        writes: list[int] = []

        class Counting:
            async def write(self, data: bytes) -> None:
                writes.append(len(data))
                await pipe_writer.write(data)

        writer_task = asyncio.create_task(write_loop(conn.output, Counting()))
        stop = StopSignal()
        pump = asyncio.create_task(pump_input(coordinator, conn, reader, writer_task, stop))
        # Answers of every kind, synchronous and rejected, in one pipelined stream.
        expected: list[tuple[str | None, str | None]] = []
        data = bytearray()
        for i in range(300):
            kind = i % 6
            if kind == 0:
                data += _line(f"s{i}")
                expected.append((f"s{i}", None))
            elif kind == 1:
                data += _line(f"c{i}", "capabilities")
                expected.append((f"c{i}", None))
            elif kind == 2:
                data += _line(f"l{i}", "session.list")
                expected.append((f"l{i}", None))
            elif kind == 3:
                data += b"{not json\n"
                expected.append((None, "invalid_json"))
            elif kind == 4:
                data += _line(f"u{i}", "no.such.method")
                expected.append((f"u{i}", "unsupported_operation"))
            else:
                data += _line(f"p{i}", "status", {"x": 1})
                expected.append((f"p{i}", "invalid_payload"))
        out = bytearray()
        loop = asyncio.get_running_loop()

        async def drain_output() -> None:
            while out.count(b"\n") < len(expected):
                out.extend(await loop.run_in_executor(None, os.read, out_read, 1 << 20))

        reading = asyncio.create_task(drain_output())
        await loop.run_in_executor(None, os.write, in_write, bytes(data))
        await asyncio.wait_for(reading, WAIT)
        answers = [orjson.loads(line) for line in out.splitlines()]
        got = [(a["request_id"], a["error"] and a["error"]["code"]) for a in answers]
        assert got == expected
        assert conn.reserved == set()  # every answer written, every ID released

        # Each answer is written (one write) before the next record is handled.
        count = 64
        writes.clear()
        out.clear()
        expected = [(f"c{i}", None) for i in range(count)]
        reading = asyncio.create_task(drain_output())
        data = bytearray(b"".join(_line(f"c{i}", "capabilities") for i in range(count)))
        await loop.run_in_executor(None, os.write, in_write, bytes(data))
        await asyncio.wait_for(reading, WAIT)
        answers = [orjson.loads(line) for line in out.splitlines()]
        assert [(a["request_id"], a["error"]) for a in answers] == expected
        assert len(writes) == count
        os.close(in_write)
        in_write = -1
        await asyncio.wait_for(pump, WAIT)
        conn.output.finish()
        assert await asyncio.wait_for(writer_task, WAIT) is True
    finally:
        for fd in (in_read, in_write, out_read, out_write):
            if fd >= 0:
                os.close(fd)


async def _sessions(coordinator: ServiceCoordinator, conn: Connection) -> list[Any]:
    """The sessions a fresh connection of the same service lists."""
    other = coordinator.open_connection(conn.ctx)
    try:
        init = envelope.request("i", "initialize", {"supported_protocol_versions": [1]})
        await coordinator.handle_record(other, orjson.dumps(init))
        listed = await coordinator.handle_record(other, _line("l", "session.list"))
        assert listed is not None and listed.messages[0]["error"] is None
        sessions: list[Any] = listed.messages[0]["payload"]["sessions"]
        return sessions
    finally:
        await coordinator.close_connection(other)


async def test_the_next_record_waits_until_the_answer_before_it_is_written(
    core: tuple[ServiceCoordinator, Connection],
) -> None:
    coordinator, conn = core
    reader = Chunks()
    writer = Recorder()
    writer.hold.clear()  # stdout blocked: nothing is written yet
    writer_task = asyncio.create_task(write_loop(conn.output, writer))
    pump = asyncio.create_task(pump_input(coordinator, conn, reader, writer_task, StopSignal()))
    reader.push(_line("first") + _line("second", "session.create") + _line("first"))
    await _settled(lambda: "first" in conn.reserved)
    await asyncio.sleep(0.05)
    # Read, not handled: only the first record was decoded (it alone holds its ID).
    assert conn.reserved == {"first"}
    assert await _sessions(coordinator, conn) == []
    writer.hold.set()
    await _settled(lambda: len(writer.lines()) == 3)
    first, second, again = writer.lines()
    assert [first["request_id"], second["request_id"]] == ["first", "second"]
    assert second["error"] is None
    # Its ID was free again by then: the answer before it had been written.
    assert again["request_id"] == "first" and again["error"] is None
    assert len(writer.writes) == 3
    reader.push(b"")
    await asyncio.wait_for(pump, WAIT)
    conn.output.finish()
    assert await asyncio.wait_for(writer_task, WAIT) is True


async def test_after_a_failed_write_no_record_read_behind_it_takes_effect(
    core: tuple[ServiceCoordinator, Connection],
) -> None:
    coordinator, conn = core
    reader = Chunks()
    writer = Recorder()
    writer.hold.clear()
    writer.fail = BrokenPipeError
    writer_task = asyncio.create_task(write_loop(conn.output, writer))
    pump = asyncio.create_task(pump_input(coordinator, conn, reader, writer_task, StopSignal()))
    reader.push(_line("s") + _line("c", "session.create") + _line("t"))
    await _settled(lambda: "s" in conn.reserved)
    writer.hold.set()
    await asyncio.wait_for(pump, WAIT)  # it returns: the output failed
    assert await asyncio.wait_for(writer_task, WAIT) is False
    assert writer.writes == []
    assert conn.reserved == set()  # only the first record was handled (and settled)
    assert await _sessions(coordinator, conn) == []


async def test_a_stop_ends_a_blocked_read_as_at_eof(
    core: tuple[ServiceCoordinator, Connection],
) -> None:
    coordinator, conn = core
    reader = Chunks()
    writer = Recorder()
    writer_task = asyncio.create_task(write_loop(conn.output, writer))
    stop = StopSignal()
    pump = asyncio.create_task(pump_input(coordinator, conn, reader, writer_task, stop))
    reader.push(_line("before"))
    await _settled(lambda: len(writer.lines()) == 1)
    await asyncio.sleep(0.01)  # the pump now waits for input that never comes
    stop.set()
    await asyncio.wait_for(pump, WAIT)
    assert not pump.cancelled()
    conn.output.finish()
    assert await asyncio.wait_for(writer_task, WAIT) is True
