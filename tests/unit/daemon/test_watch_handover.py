"""Watching (core/watch.py) and control hand-over (core/handover.py) in a daemon run in
this test's loop (in-memory transport, real domains and session files), through the
client library. A turn held on an approval request is the running turn: the hand-off
from history to live is whole (no gap) and single (no duplicate); an unanswered control
request is granted only once no turn runs; a refusal refuses; a release grants at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.process.turn_support import tool_call, tool_reply, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon, in_memory_daemon

from magi_code.client import (
    ApprovalRequest,
    Client,
    ControlChanged,
    ControlError,
    ControlRefused,
    ControlRequested,
    Event,
    EventEnvelope,
    TurnStarted,
    Watched,
    WatchedApproval,
)

INITIALIZE = {"supported_protocol_versions": [1]}


async def _client(daemon: InMemoryDaemon) -> Client:
    client = Client(await daemon.channel("persistent", {"approvals": True}))
    assert (await client.request("initialize", INITIALIZE))["error"] is None
    return client


async def _until(client: Client, want: Callable[[Event], bool], seen: list[Event]) -> Event:
    """The next event ``want`` accepts; every event taken is appended to ``seen``."""
    async with asyncio.timeout(30):
        while True:
            event = await client.next_event()
            assert event is not None, "the connection ended"
            seen.append(event)
            if want(event):
                return event


def _terminal(event: Event) -> bool:
    inner = event.event if isinstance(event, Watched) else event
    return isinstance(inner, dict) and inner["event"] == "turn.terminal"


def _turn_events(seen: list[Event], turn_id: str) -> list[EventEnvelope]:
    envelopes = [e.event if isinstance(e, Watched) else e for e in seen]
    return [e for e in envelopes if isinstance(e, dict) and e["payload"].get("turn_id") == turn_id]


async def _held_turn(
    owner: Client, fake: FakeProviderServer, session_id: str, seen: list[Event]
) -> tuple[str, ApprovalRequest]:
    """A turn that runs until its approval request is answered."""
    fake.enqueue(tool_reply(tool_call("s1", "shell", command="touch held.txt")))
    fake.enqueue(Reply(text=["held"]))
    started = await owner.request("turn.start", {"prompt": "held"}, session_id=session_id)
    assert started["payload"] is not None
    request = await _until(owner, lambda e: isinstance(e, ApprovalRequest), seen)
    assert isinstance(request, ApprovalRequest)
    return started["payload"]["turn_id"], request


async def _session(owner: Client) -> str:
    created = await owner.request("session.create", {})
    assert created["payload"] is not None
    return str(created["payload"]["session_id"])


async def test_a_turn_running_at_the_watch_comes_live_whole_and_not_as_history(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    async with in_memory_daemon(home, project) as daemon:
        owner, watcher = await _client(daemon), await _client(daemon)
        mine: list[Event] = []
        seen: list[Event] = []
        session_id = await _session(owner)
        fake.enqueue(Reply(text=["first"]))
        first = await owner.request("turn.start", {"prompt": "done"}, session_id=session_id)
        assert first["payload"] is not None
        await _until(owner, _terminal, mine)
        turn_id, request = await _held_turn(owner, fake, session_id, mine)

        history = await watcher.watch(session_id)
        # The finished turn is history; the running one is not (it comes live).
        assert [i.get("text") for i in history["items"] if i["kind"] == "message"] == [
            "done",
            "first",
        ]
        assert all(i.get("turn_id") != turn_id for i in history["items"])
        begun = await _until(watcher, lambda e: isinstance(e, Watched), seen)
        assert isinstance(begun, Watched)
        assert begun.event == TurnStarted(session_id, turn_id, begun.event.by, "held", True)  # type: ignore[union-attr]
        # The pending approval request is told to a watcher that comes late too.
        await _until(
            watcher, lambda e: isinstance(e, Watched) and isinstance(e.event, WatchedApproval), seen
        )
        await owner.answer_approval(request.approval_id, "allow_once")
        await _until(owner, _terminal, mine)
        await _until(watcher, _terminal, seen)

        live = _turn_events(seen, turn_id)
        own = _turn_events(mine, turn_id)
        sequences = [e["payload"]["sequence"] for e in live]
        assert live[0]["event"] == "turn.started"
        assert sequences == [e["payload"]["sequence"] for e in own]
        assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
        await owner.close()
        await watcher.close()


async def test_an_unanswered_request_is_granted_only_once_no_turn_runs(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    async with in_memory_daemon(home, project) as daemon:
        handover = daemon.server.core.handover
        assert handover is not None
        handover.timeout = 0.05  # the daemon's MC_DAEMON_CONTROL_REQUEST_SECONDS
        owner, asker = await _client(daemon), await _client(daemon)
        mine: list[Event] = []
        session_id = await _session(owner)
        _turn_id, request = await _held_turn(owner, fake, session_id, mine)

        requesting = asyncio.create_task(asker.request_control(session_id))
        await _until(owner, lambda e: isinstance(e, ControlRequested), mine)
        pending = handover._pending[session_id]
        async with asyncio.timeout(30):  # the timeout passed; the turn still runs
            while pending.waiter is None:
                await asyncio.sleep(0.01)
        assert not requesting.done()

        await owner.answer_approval(request.approval_id, "allow_once")
        granted = await asyncio.wait_for(requesting, 30)
        assert granted["turns"] == []
        await _until(owner, lambda e: isinstance(e, ControlChanged), mine)
        kinds = [e["event"] if isinstance(e, dict) else type(e).__name__ for e in mine]
        assert kinds.index("turn.terminal") < kinds.index("ControlChanged")
        await owner.close()
        await asker.close()


async def test_a_refusal_refuses_and_a_release_grants_at_once(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    async with in_memory_daemon(home, project) as daemon:
        owner, asker, third = await _client(daemon), await _client(daemon), await _client(daemon)
        mine: list[Event] = []
        session_id = await _session(owner)

        requesting = asyncio.create_task(asker.request_control(session_id))
        await _until(owner, lambda e: isinstance(e, ControlRequested), mine)
        with pytest.raises(ControlError) as busy:  # one request waits per session
            await third.request_control(session_id)
        assert busy.value.code == "session_busy"
        await owner.answer_control(session_id, False)
        with pytest.raises(ControlRefused):
            await asyncio.wait_for(requesting, 30)

        requesting = asyncio.create_task(asker.request_control(session_id))
        await _until(owner, lambda e: isinstance(e, ControlRequested), mine)
        await owner.release_control(session_id)
        granted = await asyncio.wait_for(requesting, 30)
        assert granted["session_id"] == session_id
        refused = await owner.request("turn.start", {"prompt": "x"}, session_id=session_id)
        assert refused["error"] is not None and refused["error"]["code"] == "session_busy"
        for client in (owner, asker, third):
            await client.close()
