"""A finished turn is freed when it ends, by reference counting. Nothing of it may wait in
a reference cycle for the cycle collector: on a daemon whose heap holds many long-lived
objects a full collection runs rarely, and until then every finished turn's agent, tools,
conversation and request body would pile up, raising the heap's high-water mark with each
turn (``docs/development.md``, "What a turn leaves for the cycle collector"). Checked for
each way a turn ends: completed after a tool call, failed, and cancelled mid-stream; and
for a connection's end, of both roles a frontend's connection has (a persistent client,
and the stdio shim: one connection for every service a frontend starts)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from tests.process.turn_support import tool_call, tool_reply
from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.inprocess import InMemoryDaemon, V1Service

from magi_code.client import Client

# The prompt (within the protocol's string limit) makes every request body longer.
PROMPT_BYTES = 16_000
PROMPT = "x" * PROMPT_BYTES


async def _client(daemon: InMemoryDaemon) -> Client:
    client = Client(await daemon.channel("persistent"))
    answer = await client.request("initialize", {"supported_protocol_versions": [1]})
    assert answer["error"] is None, answer
    return client


async def _start(client: Client, session_id: str | None) -> dict[str, str]:
    started = await client.request("turn.start", {"prompt": PROMPT}, session_id=session_id)
    assert started["error"] is None, started
    return started["payload"]


async def _next(client: Client, name: str) -> dict[str, object]:
    async with asyncio.timeout(30):
        while True:
            event = await client.next_event()
            assert event is not None, "the connection ended"
            if isinstance(event, dict) and event["event"] == name:
                return event["payload"]


async def _turn_tasks_done() -> None:
    """Until no task of a turn runs any more (its terminal event goes out before it ends)."""
    async with asyncio.timeout(30):
        while any(
            getattr(task.get_coro(), "__qualname__", "").startswith("TurnRun.")
            for task in asyncio.all_tasks()
        ):
            await asyncio.sleep(0.01)


async def _connections_gone(daemon: InMemoryDaemon) -> None:
    async with asyncio.timeout(30):
        while daemon.server.peers:
            await asyncio.sleep(0.01)


@asynccontextmanager
async def _saved_garbage() -> AsyncIterator[list[object]]:
    """What a collection finds unreachable after the block (the collector keeps it)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[object] = []
    try:
        yield found
        await _turn_tasks_done()
        gc.collect()
        found += gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def _completed(client: Client, fake: FakeProviderServer, session_id: str) -> None:
    fake.enqueue(
        tool_reply(tool_call("r1", "read_file", path="notes.txt")),
        Reply(text=["streamed ", "in ", "parts"]),
    )
    await _start(client, session_id)
    assert (await _next(client, "turn.terminal"))["status"] == "completed"


async def _failed(client: Client, fake: FakeProviderServer, session_id: str) -> None:
    fake.enqueue(HttpError(400))
    await _start(client, session_id)
    assert (await _next(client, "turn.terminal"))["status"] == "failed"


async def _cancelled(client: Client, fake: FakeProviderServer, session_id: str) -> None:
    fake.enqueue(Reply(text=["first ", "second"], after_chunks=1, ending="stall"))
    turn = await _start(client, session_id)
    await _next(client, "turn.assistant_delta")
    assert (await client.request("turn.cancel", {"turn_id": turn["turn_id"]}))["error"] is None
    assert (await _next(client, "turn.terminal"))["status"] == "cancelled"


Ending = Callable[[Client, FakeProviderServer, str], Awaitable[None]]


@pytest.mark.parametrize("ending", [_completed, _failed, _cancelled], ids=lambda f: f.__name__)
async def test_a_finished_turn_leaves_nothing_for_the_cycle_collector(
    project: Path, daemon: InMemoryDaemon, fake: FakeProviderServer, ending: Ending
) -> None:
    (project / "notes.txt").write_text("read me\n")
    client = await _client(daemon)
    fake.enqueue(Reply(text=["warm"]))
    session_id = (await _start(client, None))["session_id"]  # first-use caches and imports
    await _next(client, "turn.terminal")
    await _turn_tasks_done()
    try:
        async with _saved_garbage() as garbage:
            await ending(client, fake, session_id)
            # Its connection holds the turn until the client goes.
            await client.close()
            await _connections_gone(daemon)
    finally:
        await client.close()
    ours = {type(o).__qualname__ for o in garbage if type(o).__module__.startswith("magi_code.")}
    # Bytes are not tracked by the collector: the bodies the cycles hold.
    held = (r for o in garbage for r in gc.get_referents(o))
    bodies = [r for r in held if isinstance(r, bytes) and len(r) >= PROMPT_BYTES]
    assert ours == set()
    assert bodies == []
    sent = fake.requests[-1]  # the body handed over once is still sent whole, unchunked
    assert sent.headers["content-length"] == str(len(sent.body)) and len(sent.body) > PROMPT_BYTES
    assert "transfer-encoding" not in sent.headers


async def _persistent_turn(daemon: InMemoryDaemon) -> Callable[[], Awaitable[object]]:
    client = await _client(daemon)
    await _start(client, None)
    await _next(client, "turn.terminal")
    return client.close


async def _shim_turn(daemon: InMemoryDaemon) -> Callable[[], Awaitable[object]]:
    service = await V1Service.start(daemon)
    for method, payload in (
        ("initialize", {"supported_protocol_versions": [1]}),
        ("turn.start", {"prompt": "hello"}),
    ):
        request = {"protocol_version": 1, "kind": "request", "request_id": method}
        await service.send({**request, "method": method, "payload": payload})
    async with asyncio.timeout(30):
        while (await service.recv()).get("event") != "turn.terminal":
            pass

    async def close() -> int:
        await service.close_stdin()
        return await service.wait()

    return close


Connect = Callable[[InMemoryDaemon], Awaitable[Callable[[], Awaitable[object]]]]


@pytest.mark.parametrize("connect", [_persistent_turn, _shim_turn], ids=lambda f: f.__name__)
async def test_a_closed_connection_is_freed_by_reference_counting(
    daemon: InMemoryDaemon, fake: FakeProviderServer, connect: Connect
) -> None:
    gc.collect()
    gc.disable()  # only reference counting frees anything from here
    try:
        fake.enqueue(Reply(text=["a ", "reply"]))
        close = await connect(daemon)
        [peer] = daemon.server.peers
        freed = weakref.ref(peer)
        del peer
        await close()
        await _connections_gone(daemon)
        async with asyncio.timeout(10):  # its last callbacks may still hold it a moment
            while freed() is not None:
                await asyncio.sleep(0.01)
    finally:
        gc.enable()
