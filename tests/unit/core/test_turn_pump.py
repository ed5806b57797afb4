"""A turn's events leave in batches: while one write is open, the events queued behind
it (their records durable) go out together in the next write, in order; at most
``PUMP_IN_FLIGHT`` of a turn's batches are out and not yet written.

Real coordinator and domains on a temporary home, a real loopback fake provider; the
stdout writer is an in-memory one the test holds open.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson

from magi_code.composition import build_coordinator
from magi_code.core.coordinator import Connection, ServiceCoordinator
from magi_code.core.output import Batch
from magi_code.core.turns import PUMP_BATCH, PUMP_IN_FLIGHT
from magi_code.protocol import envelope
from magi_code.stdio.adapter import write_loop
from magi_code.storage.launch import LaunchContext
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply

WAIT = 10.0
CALLS = 12


class HeldWriter:
    """Records every write; the first one with a turn activity stays open until
    ``released`` is set."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.released = asyncio.Event()

    async def write(self, data: bytes) -> None:
        if b'"event":"turn.activity"' in data:
            await self.released.wait()
        self.writes.append(data)

    def messages(self, data: bytes) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in data.splitlines()]


async def connected(
    tmp_path: Path, fake: FakeProviderServer, calls: int
) -> tuple[ServiceCoordinator, Connection]:
    """A coordinator on a new home, and a connection; the provider will answer with
    ``calls`` ``list_files`` calls, then with text."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    project = tmp_path / "project"
    project.mkdir()
    write_settings(home, fake)
    listing = json.dumps({"pattern": "*"})
    tool_calls = [FakeToolCall(f"c{i}", "list_files", listing) for i in range(calls)]
    fake.enqueue(Reply(text=[], tool_calls=tool_calls), Reply(text=["done"]))
    ctx = LaunchContext(home, project, {"MC_HOME": str(home)})
    coordinator = await build_coordinator(ctx)
    return coordinator, coordinator.open_connection(ctx)


async def start_turn(coordinator: ServiceCoordinator, conn: Connection) -> None:
    for request_id, method, payload in (
        ("init", "initialize", {"supported_protocol_versions": [1]}),
        ("t1", "turn.start", {"prompt": "list", "options": {}}),
    ):
        record = orjson.dumps(envelope.request(request_id, method, payload))
        await coordinator.handle_record(conn, record)  # its answer is queued for output


async def test_events_queued_behind_an_open_write_leave_together_in_order(
    tmp_path: Path, fake: FakeProviderServer
) -> None:
    coordinator, conn = await connected(tmp_path, fake, CALLS)
    writer = HeldWriter()
    writing = asyncio.create_task(write_loop(conn.output, writer))
    try:
        await start_turn(coordinator, conn)
        # The turn runs to its end while the write of its first activity is open.
        async with asyncio.timeout(WAIT):
            while len([r for r in fake.requests if r.method == "POST"]) < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
        writer.released.set()
        async with asyncio.timeout(WAIT):
            while not any(b"turn.terminal" in w for w in writer.writes):
                await asyncio.sleep(0.01)
    finally:
        writer.released.set()
        await coordinator.close_connection(conn)
        conn.output.finish()
        await asyncio.wait_for(writing, WAIT)
    streamed = ("turn.activity", "turn.assistant_delta", "turn.terminal")
    per_write = [
        [m for m in writer.messages(w) if m.get("event") in streamed] for w in writer.writes
    ]
    per_write = [batch for batch in per_write if batch]
    events = [m for batch in per_write for m in batch]
    assert events[-1]["event"] == "turn.terminal"
    assert events[-1]["payload"]["status"] == "completed"
    sequences = [m["payload"]["sequence"] for m in events]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    tools = [
        m
        for m in events
        if m["event"] == "turn.activity" and m["payload"]["activity"]["kind"] == "tool"
    ]
    assert len(tools) == 2 * CALLS
    # What queued behind the open write left in few writes, none larger than the bound.
    assert max(len(batch) for batch in per_write) > 1
    assert all(len(batch) <= PUMP_BATCH + 1 for batch in per_write)
    assert len(per_write) < len(events) // 2


async def test_a_turn_has_at_most_its_window_of_batches_unwritten(
    tmp_path: Path, fake: FakeProviderServer
) -> None:
    coordinator, conn = await connected(tmp_path, fake, 40)
    held: list[Batch] = []
    messages: list[dict[str, Any]] = []
    holding = True

    async def consume() -> None:
        # Answers are written at once (the acceptance, with ``turn.started``, starts the
        # turn); the batches of the turn's pump are held until the test settles them.
        while (batch := await conn.output.get()) is not None:
            messages.extend(batch.messages)
            if holding and all(m["kind"] == "event" for m in batch.messages):
                held.append(batch)
            else:
                batch.written()

    consuming = asyncio.create_task(consume())
    try:
        await start_turn(coordinator, conn)
        async with asyncio.timeout(WAIT):
            while len(held) < PUMP_IN_FLIGHT:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # were the window unbounded, more would be out by now
        assert len(held) == PUMP_IN_FLIGHT
        settled = 0
        async with asyncio.timeout(WAIT):
            while not any(m.get("event") == "turn.terminal" for m in messages):
                # Each batch written lets one more out, never more than the window.
                while settled < len(held):
                    held[settled].written()
                    settled += 1
                await asyncio.sleep(0.01)
                assert len(held) - settled <= PUMP_IN_FLIGHT
    finally:
        holding = False
        for batch in held:
            batch.written()
        await coordinator.close_connection(conn)
        conn.output.finish()
        await asyncio.wait_for(consuming, WAIT)
    events = [m for m in messages if m.get("event", "").startswith("turn.")]
    sequences = [m["payload"]["sequence"] for m in events]
    assert sequences == list(range(len(sequences)))  # in order, nothing dropped
    assert events[-1]["payload"]["activity_dropped"] == 0
