"""Turns through the daemon: connection-scoped shims, owner drop, persistent survival."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from magi_code.client import Client
from tests.process.daemon.support import (
    cli,
    context,
    persistent,
    replay_in_new_shim,
    status,
    wait_for,
)
from tests.process.turn_support import start_turn, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess


def _terminal(items: list[dict[str, Any]], turn_id: str) -> dict[str, Any]:
    """The one terminal replay item (each of these tests runs one turn per session)."""
    found = [i for i in items if i.get("kind") == "terminal"]
    assert len(found) == 1, items
    assert found[0].get("turn_id", turn_id) == turn_id
    return found[0]


async def test_shim_killed_mid_turn_cancels_its_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["partial"], ending="stall", after_chunks=1))
    svc = await ServiceProcess.start(home, project)
    await svc.initialize()
    _, accepted = await start_turn(svc, "hang")
    await wait_for(lambda: len(fake.requests) == 1, what="the provider request")
    svc.proc.kill()
    await svc.proc.wait()
    await wait_for(lambda: status(home)["active_turns"] == 0, what="the turn to end")
    items = await replay_in_new_shim(home, project, accepted["session_id"])
    assert _terminal(items, accepted["turn_id"])["status"] == "cancelled"
    await svc.stop()


async def test_daemon_stop_during_a_turn_persists_it_as_cancelled(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["partial"], ending="stall", after_chunks=1))
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        rid, accepted = await start_turn(svc, "hang")
        await wait_for(lambda: len(fake.requests) == 1, what="the provider request")
        stopped = await asyncio.to_thread(cli, home, "daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        # The shim still received the terminal event before its connection ended.
        events = await svc.events_until_terminal(rid)
        assert events[-1]["payload"]["status"] == "cancelled"
        assert await svc.wait() == 0
    finally:
        await svc.stop()
    items = await replay_in_new_shim(home, project, accepted["session_id"])
    assert _terminal(items, accepted["turn_id"])["status"] == "cancelled"


async def test_persistent_client_killed_mid_turn_the_turn_completes(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    chunks = [f"w{i} " for i in range(12)]
    fake.enqueue(Reply(text=chunks, chunk_delay=0.15))
    client = await persistent(home, project)
    reply = await client.request("turn.start", {"prompt": "go"})
    assert reply["error"] is None, reply
    turn_id, session_id = reply["payload"]["turn_id"], reply["payload"]["session_id"]
    seen = -1
    async for event in client.events():
        if event["event"] == "turn.assistant_delta":
            seen = event["payload"]["sequence"]
            break
    await client.close()  # the client goes away mid-turn
    assert status(home)["active_turns"] == 1

    # A new client follows the turn from the last sequence it saw: no gap, no repeat.
    again = await Client.connect(context(home, project), "persistent")
    try:
        snapshot = {t["turn_id"]: t for t in await again.snapshot()}
        assert snapshot[turn_id]["status"] in ("running", "completed")
        attached = await again.attach(turn_id, seen)
        events = list(attached["events"])
        if attached["status"] == "attached":
            async for event in again.events():
                events.append(event)
                if event["event"] == "turn.terminal":
                    break
        sequences = [e["payload"]["sequence"] for e in events]
        assert sequences == list(range(seen + 1, seen + 1 + len(sequences)))
        terminal = events[-1]["payload"]
        assert terminal["status"] == "completed"
        assert terminal["assistant_text"] == "".join(chunks)
        finished = {t["turn_id"]: t for t in await again.snapshot()}[turn_id]
        assert finished["status"] == "completed"
    finally:
        await again.close()
    items = await replay_in_new_shim(home, project, session_id)
    assert _terminal(items, turn_id)["status"] == "completed"


async def test_reattach_after_the_turn_finished_reads_the_retained_outcome(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["a", "b"], chunk_delay=0.2))
    client = await persistent(home, project)
    reply = await client.request("turn.start", {"prompt": "go"})
    turn_id = reply["payload"]["turn_id"]
    await client.close()
    await wait_for(lambda: status(home)["active_turns"] == 0, what="the detached turn")
    again = await Client.connect(context(home, project), "persistent")
    try:
        attached = await again.attach(turn_id, 0)
        assert attached["status"] == "finished"
        assert attached["events"][-1]["event"] == "turn.terminal"
        assert attached["events"][-1]["payload"]["assistant_text"] == "ab"
    finally:
        await again.close()


async def test_v1_capabilities_through_the_shim_advertise_only_stdio(
    home: Path, project: Path
) -> None:
    svc = await ServiceProcess.start(home, project)
    try:
        init = await svc.initialize()
        assert init["payload"]["capabilities"]["transports"] == ["stdio"]
    finally:
        await svc.stop()
    client = await persistent(home, project)
    try:
        caps = await client.request("capabilities")
        assert caps["payload"]["transports"] == ["unix"]
    finally:
        await client.close()
