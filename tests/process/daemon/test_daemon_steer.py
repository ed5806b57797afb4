"""Steering a running turn (RFC-0002 §6.10) through a real daemon: the controller's text
enters the turn at its next request boundary (the fake provider's next request carries
it after the tool result), the controller and a watcher see ``turn.steered``, the turn
goes on, and v1 replay shows the text where it entered. A steer after the turn ended is
``turn_finished`` and its text heads the session's queue; only the controller may steer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from magi_code.client import Client, SteerError, TurnStarted, Watched, connect_channel
from tests.process.daemon.support import context, persistent, replay_in_new_shim, wait_for
from tests.process.turn_support import held_shell, tool_call, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.v2peer import Peer

STEER = "also look at the tests"


async def _events_until_terminal(client: Client) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async for event in client.events():
        events.append(dict(event))
        if event["event"] == "turn.terminal":
            return events
    raise AssertionError("the connection ended before the turn did")


async def test_a_steer_enters_the_next_request_and_replays_where_it_entered(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release, command = held_shell(project)
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("t1", "shell", command=command)]),
        Reply(text=["steered ", "answer"]),
    )
    client = await persistent(home, project)
    channel = await connect_channel(
        context(home, project), "persistent", autostart=True, client_name="watcher"
    )
    watcher = await Peer.over(channel)
    try:
        reply = await client.request("turn.start", {"prompt": "fix the bug"})
        assert reply["error"] is None, reply
        turn_id, session_id = reply["payload"]["turn_id"], reply["payload"]["session_id"]
        await watcher.call({"t": "watch", "session_id": session_id}, "watch_result")
        await wait_for(started.exists, 60, "the tool to start")

        # Only the controller steers: the watcher's steer is refused, and so is bad text.
        refused = await watcher.call(
            {"t": "steer", "turn_id": turn_id, "text": "not mine"}, "steer_result"
        )
        assert refused == {"t": "steer_error", "id": refused["id"], "code": "unknown_turn"}
        bad = await watcher.call({"t": "steer", "turn_id": turn_id, "text": " "}, "steer_result")
        assert bad["code"] == "invalid_request"

        steer = asyncio.create_task(client.steer(turn_id, STEER))
        await client.status()  # a round trip: the daemon took the steer before answering
        assert not steer.done()  # it waits for the tool call in flight
        release.touch()
        await asyncio.wait_for(steer, 60)
        events = await asyncio.wait_for(_events_until_terminal(client), 60)
    finally:
        await client.close()

    terminal = events[-1]["payload"]
    assert terminal["status"] == "completed", terminal
    assert terminal["assistant_text"] == "steered answer"
    steered = [e for e in events if e["event"] == "turn.steered"]
    assert [e["payload"]["text"] for e in steered] == [STEER]
    names = [e["event"] for e in events]
    # After the tool call's activity, before the reply it steered.
    assert names.index("turn.steered") < names.index("turn.assistant_delta")
    sequences = [e["payload"]["sequence"] for e in events]
    assert sequences == sorted(set(sequences))

    # The provider's next request carries the text, after the tool's result.
    bodies = [request.json for request in fake.requests if request.path.endswith("/completions")]
    assert len(bodies) == 2, bodies
    assert STEER not in json.dumps(bodies[0])
    messages = bodies[1]["messages"]
    assert messages[-1] == {"role": "user", "content": STEER}
    assert messages[-2]["role"] == "tool"

    try:
        seen = await watcher.until(
            lambda f: f["t"] == "watch_message" and f["message"]["event"] == "turn.steered"
        )
        assert seen["message"]["payload"]["text"] == STEER
    finally:
        await watcher.close()

    replay = await replay_in_new_shim(home, project, session_id)
    texts = [(item["kind"], item.get("role"), item.get("text")) for item in replay]
    assert texts == [
        ("message", "user", "fix the bug"),
        ("message", "user", STEER),
        ("message", "assistant", "steered answer"),
        ("terminal", None, None),
    ], texts


async def test_a_steer_after_the_turn_ended_is_turn_finished_and_goes_to_the_queue(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """Too late for its turn, the text is not lost: it heads the session's queue (§6.12)
    and runs as the next turn."""
    write_settings(home, fake)
    fake.enqueue(Reply(text=["done"]), Reply(text=["queued answer"]))
    client = await persistent(home, project)
    try:
        opened = await client.request("session.create", {})
        session_id = opened["payload"]["session_id"]
        reply = await client.request("turn.start", {"prompt": "quick"}, session_id=session_id)
        turn_id = reply["payload"]["turn_id"]
        await asyncio.wait_for(_events_until_terminal(client), 60)
        await client.watch(session_id)
        with pytest.raises(SteerError) as ended:
            await client.steer(turn_id, STEER)
        assert ended.value.code == "turn_finished"
        assert ended.value.text == STEER
        assert ended.value.entry_id is not None
        with pytest.raises(SteerError) as unknown:
            await client.steer("turn_nope", STEER)
        assert unknown.value.code == "unknown_turn"
        async with asyncio.timeout(60):
            while True:
                event = await client.next_event()
                assert event is not None
                if isinstance(event, Watched) and isinstance(event.event, TurnStarted):
                    assert event.event.prompt == STEER
                if (
                    isinstance(event, Watched)
                    and isinstance(event.event, dict)
                    and event.event["event"] == "turn.terminal"
                ):
                    break
    finally:
        await client.close()
    replay = await replay_in_new_shim(home, project, session_id)
    texts = [(item.get("role"), item.get("text")) for item in replay if item["kind"] == "message"]
    assert texts == [
        ("user", "quick"),
        ("assistant", "done"),
        ("user", STEER),
        ("assistant", "queued answer"),
    ]
