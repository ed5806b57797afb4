"""A finished turn is freed when it ends, by reference counting. Nothing of it may wait in
a reference cycle for the cycle collector: on a daemon whose heap holds many long-lived
objects a full collection runs rarely, and until then every finished turn's agent, tools,
conversation and request body would pile up, raising the heap's high-water mark with each
turn (``docs/unix-daemon.md``, "Memory over days")."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from tests.process.turn_support import tool_call, tool_reply
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon

from magi_code.client import Client

# The prompt (within the protocol's string limit) makes every request body longer.
PROMPT_BYTES = 16_000


async def _turn(client: Client, prompt: str, session_id: str | None) -> str:
    """Run one turn to its terminal event; returns its session."""
    started = await client.request("turn.start", {"prompt": prompt}, session_id=session_id)
    assert started["error"] is None, started
    async with asyncio.timeout(30):
        while True:
            event = await client.next_event()
            assert event is not None, "the connection ended"
            if isinstance(event, dict) and event["event"] == "turn.terminal":
                assert event["payload"]["status"] == "completed", event
                return str(started["payload"]["session_id"])


async def _turn_tasks_done() -> None:
    """Until no task of a turn runs any more (its terminal event goes out before it ends)."""
    async with asyncio.timeout(30):
        while any(
            getattr(task.get_coro(), "__qualname__", "").startswith("TurnRun.")
            for task in asyncio.all_tasks()
        ):
            await asyncio.sleep(0.01)


async def test_a_finished_turn_leaves_nothing_for_the_cycle_collector(
    project: Path, daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    (project / "notes.txt").write_text("read me\n")
    client = Client(await daemon.channel("persistent"))
    try:
        assert (await client.request("initialize", {"supported_protocol_versions": [1]}))[
            "error"
        ] is None
        fake.enqueue(Reply(text=["warm"]))
        session_id = await _turn(client, "warm up", None)  # first-use caches and imports
        await _turn_tasks_done()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept, to be looked at
        try:
            fake.enqueue(
                tool_reply(tool_call("r1", "read_file", path="notes.txt")),
                Reply(text=["streamed ", "in ", "parts"]),
            )
            await _turn(client, "x" * PROMPT_BYTES, session_id)
            await _turn_tasks_done()
            gc.collect()
            ours = {type(o).__qualname__ for o in gc.garbage if _ours(o)}
            # Bytes are not tracked by the collector: what the cycles hold.
            held = (r for o in gc.garbage for r in gc.get_referents(o))
            bodies = [r for r in held if isinstance(r, bytes) and len(r) >= PROMPT_BYTES]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert len(fake.requests) == 3  # the tool loop sent the conversation twice
        for sent in fake.requests:  # the body handed over once is still sent whole, unchunked
            assert sent.headers["content-length"] == str(len(sent.body))
            assert "transfer-encoding" not in sent.headers
        assert ours == set()
        assert bodies == []
    finally:
        await client.close()


def _ours(thing: object) -> bool:
    return type(thing).__module__.startswith("magi_code.")
