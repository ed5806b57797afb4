"""Persistent v2 clients against a real daemon: control grants, overload, delta
coalescing and request deadlines (RFC-0002 §6)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from magi_code.client import Channel, Client, DaemonError, DeadlineExceeded, socket_for
from tests.process.daemon.support import (
    context,
    persistent,
    replay_in_new_shim,
    status,
    wait_for,
)
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import service_env

# Client A: a real process that starts a turn, reports it, and waits to be killed.
_CLIENT_A = """
import asyncio, json, sys
from pathlib import Path
import os
from magi_code.client import Client
from magi_code.storage.launch import LaunchContext

async def main():
    ctx = LaunchContext(Path(sys.argv[1]), Path(sys.argv[2]), dict(os.environ))
    client = await Client.connect(ctx)
    await client.request("initialize", {"supported_protocol_versions": [1]})
    reply = await client.request("turn.start", {"prompt": "hang"})
    async for event in client.events():
        if event["event"] == "turn.assistant_delta":
            break
    print(json.dumps(reply["payload"]), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def _follow_to_terminal(client: Client, turn_id: str, after: int) -> list[dict[str, Any]]:
    attached = await client.attach(turn_id, after)
    events = list(attached["events"])
    if attached["status"] in ("attached", "resync"):
        async for event in client.events():
            if event["payload"].get("turn_id") == turn_id:
                events.append(event)
                if event["event"] == "turn.terminal":
                    break
    assert events and events[-1]["event"] == "turn.terminal", events
    return events


async def test_a_reattaching_client_takes_control_cancels_and_starts_a_new_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["partial"], ending="stall", after_chunks=1))
    fake.enqueue(Reply(text=["second ", "turn"]))
    client_a = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CLIENT_A,
        str(home),
        str(project),
        env=service_env(home),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert client_a.stdout is not None
        line = await asyncio.wait_for(client_a.stdout.readline(), 60)
        accepted = json.loads(line)
        turn_id, session_id = accepted["turn_id"], accepted["session_id"]
    finally:
        client_a.send_signal(signal.SIGKILL)
        await client_a.wait()
    await wait_for(lambda: status(home)["detached_turns"] == 1, what="the turn to detach")

    client_b = await persistent(home, project)
    client_c = await persistent(home, project)
    try:
        # Without a grant B may follow the turn but has no authority over it.
        refused = await client_b.request("turn.cancel", {"turn_id": turn_id})
        assert refused["error"]["code"] == "unknown_turn"
        busy = await client_b.request("turn.start", {"prompt": "x"}, session_id=session_id)
        assert busy["error"]["code"] == "session_busy"

        granted = await client_b.take_control(session_id)
        assert granted["session_id"] == session_id
        assert [t["turn_id"] for t in granted["turns"]] == [turn_id]
        assert status(home)["detached_turns"] == 0
        # Exactly one controller: a second live client cannot take it from B.
        with pytest.raises(DaemonError) as taken:
            await client_c.take_control(session_id)
        assert taken.value.code == "session_busy"
        refused = await client_c.request("turn.cancel", {"turn_id": turn_id})
        assert refused["error"]["code"] == "unknown_turn"

        cancel = await client_b.request("turn.cancel", {"turn_id": turn_id})
        assert cancel["error"] is None, cancel
        assert cancel["payload"]["status"] == "cancellation_requested"
        events = await _follow_to_terminal(client_b, turn_id, granted["turns"][0]["sequence"])
        assert events[-1]["payload"]["status"] == "cancelled"

        # B now starts a new turn on the same session (its attachment, not a new lease).
        reply = await client_b.request("turn.start", {"prompt": "again"}, session_id=session_id)
        assert reply["error"] is None, reply
        second = reply["payload"]["turn_id"]
        async for event in client_b.events():
            if event["event"] == "turn.terminal" and event["payload"]["turn_id"] == second:
                assert event["payload"]["status"] == "completed"
                assert event["payload"]["assistant_text"] == "second turn"
                break
    finally:
        await client_c.close()
        await client_b.close()
    await wait_for(lambda: status(home)["clients"] == 0, what="the clients to go")
    items = await replay_in_new_shim(home, project, session_id)
    terminals = [i["status"] for i in items if i["kind"] == "terminal"]
    assert terminals == ["cancelled", "completed"]  # the first turn, then B's new one


async def test_losing_the_connection_revokes_its_grant_not_its_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["partial"], ending="stall", after_chunks=1))
    client_b = await persistent(home, project)
    reply = await client_b.request("turn.start", {"prompt": "hang"})
    turn_id, session_id = reply["payload"]["turn_id"], reply["payload"]["session_id"]
    client_c = await persistent(home, project)
    try:
        with pytest.raises(DaemonError) as held:
            await client_c.take_control(session_id)
        assert held.value.code == "session_busy"  # B is connected and controls it
        await client_b.close()
        await wait_for(lambda: status(home)["detached_turns"] == 1, what="B's grant to go")
        granted = await client_c.take_control(session_id)
        assert [t["turn_id"] for t in granted["turns"]] == [turn_id]
        cancel = await client_c.request("turn.cancel", {"turn_id": turn_id})
        assert cancel["error"] is None, cancel
        events = await _follow_to_terminal(client_c, turn_id, -1)
        assert events[-1]["payload"]["status"] == "cancelled"
        # C keeps the session (an explicit attachment) after B's cleanup finished.
        await wait_for(lambda: status(home)["clients"] == 1, what="B's cleanup")
        closed = await client_c.request("session.close", session_id=session_id)
        assert closed["payload"]["status"] == "closed"
    finally:
        await client_c.close()


async def test_take_control_of_a_free_session_opens_it_and_rejects_bad_ids(
    home: Path, project: Path
) -> None:
    client = await persistent(home, project)
    try:
        created = await client.request("session.create")
        session_id = created["payload"]["session_id"]
        await client.request("session.close", session_id=session_id)
        granted = await client.take_control(session_id)
        assert granted["turns"] == []
        with pytest.raises(DaemonError) as bad:
            await client.take_control("../x")
        assert bad.value.code == "invalid_session_id"
    finally:
        await client.close()
    fresh = await Client.connect(context(home, project))
    try:
        with pytest.raises(DaemonError) as gated:
            await fresh.take_control(session_id)
        assert gated.value.code == "not_initialized"
    finally:
        await fresh.close()


async def test_a_client_that_stops_reading_is_cut_from_the_live_stream_not_the_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    chunks = ["ab"] * 6000  # far more frames than the socket and the 4 KiB queue hold
    fake.enqueue(Reply(text=chunks))
    ctx = context(home, project, {"MC_DAEMON_OUTBOUND_BYTES": "4096"})
    starter = await Client.connect(ctx)  # starts the daemon with the small queue bound
    await starter.close()
    slow = await Channel.open(socket_for(ctx), "persistent", ctx)
    try:
        await slow.send(_request("i1", "initialize", {"supported_protocol_versions": [1]}))
        await slow.send(_request("t1", "turn.start", {"prompt": "go"}))
        # The slow client reads nothing while the turn runs to its end (it has begun once
        # the provider has its request).
        await wait_for(lambda: len(fake.requests) == 1, 60, "the turn to reach the provider")
        await wait_for(lambda: status(home)["active_turns"] == 0, 60, "the turn to finish")

        deltas: list[dict[str, Any]] = []
        turn_id = None
        while True:
            frame = await asyncio.wait_for(slow.recv(), 20)
            assert frame is not None
            if frame["t"] == "overloaded":
                break
            message = frame["message"]
            if message.get("event") == "turn.started":
                turn_id = message["payload"]["turn_id"]
            elif message.get("event") in ("turn.assistant_delta", "turn.activity"):
                deltas.append(message["payload"])
            assert message.get("event") != "turn.terminal"
        assert frame["turn_id"] == turn_id
        after = frame["after_sequence"]
        # Every event up to the cut arrived, in order; nothing after it did.
        assert [d["sequence"] for d in deltas] == list(range(1, after + 1))

        await slow.send({"t": "attach", "id": 1, "turn_id": turn_id, "after_sequence": after})
        while (frame := await asyncio.wait_for(slow.recv(), 20)) is not None:
            if frame["t"] == "attach_result":
                break
            assert frame["t"] != "message" or frame["message"]["kind"] == "response"
        assert frame is not None
        text = "".join(d.get("text", "") for d in deltas)
        if frame["status"] == "finished":
            rest = frame["events"]
            assert rest[0]["payload"]["sequence"] == after + 1
            text += "".join(e["payload"].get("text", "") for e in rest[:-1])
            terminal = rest[-1]["payload"]
        else:
            assert frame["status"] == "resync"  # evicted from the turn's buffer
            await slow.send({"t": "snapshot", "id": 2})
            while (frame := await asyncio.wait_for(slow.recv(), 20)) is not None:
                if frame["t"] == "snapshot_result":
                    break
            assert frame is not None
            item = {t["turn_id"]: t for t in frame["turns"]}[turn_id]
            terminal = {**item["terminal"], "assistant_text": item["assistant_text"]}
            text = item["assistant_text"]
        assert terminal["status"] == "completed"
        assert terminal["assistant_text"] == text == "".join(chunks)
    finally:
        await slow.close()


async def test_delta_coalescing_merges_deltas_in_order_and_never_delays_the_terminal(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    chunks = [f"d{i} " for i in range(40)]
    fake.enqueue(Reply(text=chunks, chunk_delay=0.02))
    fake.enqueue(Reply(text=chunks, chunk_delay=0.02))
    plain = await persistent(home, project)
    client = await Client.connect(context(home, project), delta_interval_ms=200)
    try:
        await client.request("initialize", {"supported_protocol_versions": [1]})
        received = await _run_turn(client)
        journal = await client.attach(received[0]["payload"]["turn_id"], -1)  # uncoalesced
        baseline = await _run_turn(plain)
    finally:
        await client.close()
        await plain.close()
    deltas = [e["payload"] for e in received if e["event"] == "turn.assistant_delta"]
    terminal = received[-1]["payload"]
    assert "".join(d["text"] for d in deltas) == "".join(chunks) == terminal["assistant_text"]
    sequences = [d["sequence"] for d in deltas]
    assert sequences == sorted(set(sequences))
    # Merged deltas carry the last merged sequence, so the last one delivered carries
    # the turn's last delta sequence; fewer deltas than provider chunks arrived.
    original = [e["payload"] for e in journal["events"] if e["event"] == "turn.assistant_delta"]
    assert len(original) == len(chunks)
    assert sequences[-1] == original[-1]["sequence"]
    assert set(sequences) < {d["sequence"] for d in original}
    assert len(deltas) < len(chunks)
    # Other events keep their place: each follows every delta merged before it.
    others = [e["payload"]["sequence"] for e in received if e["event"] != "turn.assistant_delta"]
    assert [e["payload"]["sequence"] for e in received] == sorted(sequences + others)
    plain_deltas = [e for e in baseline if e["event"] == "turn.assistant_delta"]
    assert len(plain_deltas) == len(chunks)  # other clients are unaffected


async def test_expired_and_invalid_deadlines_are_answered_without_running(
    home: Path, project: Path
) -> None:
    client = await persistent(home, project)
    try:
        past = int(time.time() * 1000) - 1000
        with pytest.raises(DeadlineExceeded) as expired:
            await client.request("session.create", request_id="r1", deadline_ms=past)
        assert expired.value.code == "deadline_exceeded"
        with pytest.raises(DaemonError) as invalid:
            await client.request("session.create", request_id="r1", deadline_ms="soon")  # type: ignore[arg-type]
        assert invalid.value.code == "invalid_deadline"
        listed = await client.request("session.list")
        assert listed["payload"]["sessions"] == []  # nothing ran
        future = int(time.time() * 1000) + 60_000
        created = await client.request("session.create", request_id="r1", deadline_ms=future)
        assert created["error"] is None, created  # the ID was never reserved
    finally:
        await client.close()


async def _run_turn(client: Client) -> list[dict[str, Any]]:
    reply = await client.request("turn.start", {"prompt": "go"})
    assert reply["error"] is None, reply
    turn_id = reply["payload"]["turn_id"]
    events: list[dict[str, Any]] = []
    async for event in client.events():
        if event["payload"].get("turn_id") == turn_id:
            events.append(event)
            if event["event"] == "turn.terminal":
                break
    return events


def _request(rid: str, method: str, payload: dict[str, Any]) -> dict[str, Any]:
    message = {
        "protocol_version": 1,
        "kind": "request",
        "request_id": rid,
        "method": method,
        "payload": payload,
    }
    return {"t": "request", "message": message}
