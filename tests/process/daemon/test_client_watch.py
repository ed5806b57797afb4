"""Watching a session and handing over its control through the client library
(``magi_code.client``) against a real daemon (RFC-0002 §6.1, §6.9): a watcher gets the
history, then another client's turn as typed :class:`Watched` events — its start, its
events, its approval request and resolution (read-only) — and takes control on request
(granted, refused, released). The sync client watches and requests control too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magi_code.client import (
    ApprovalError,
    ApprovalRequest,
    Client,
    ControlChanged,
    ControlError,
    ControlRefused,
    ControlRequested,
    EventEnvelope,
    SyncClient,
    TurnStarted,
    Watched,
    WatchedApproval,
    WatchError,
)
from tests.process.daemon.support import context
from tests.process.turn_support import tool_call, tool_reply, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply

INITIALIZE = {"supported_protocol_versions": [1]}
STALE_CURSOR = "bm90LWEtY3Vyc29y"


# Every event each client took, in order.
SEEN: dict[int, list[object]] = {}


async def _next(client: Client, want: object) -> object:
    """The next event ``want`` accepts (others before it are skipped, and kept in SEEN)."""
    seen = SEEN.setdefault(id(client), [])
    async with asyncio.timeout(30):
        while True:
            event = await client.next_event()
            assert event is not None, "the connection ended"
            seen.append(event)
            if want(event):  # type: ignore[operator]
                return event


def _watched(kind: type) -> object:
    return lambda e: isinstance(e, Watched) and isinstance(e.event, kind)


def _envelope(event: object) -> EventEnvelope | None:
    """A turn event: the client's own, or a watched one."""
    if isinstance(event, Watched):
        event = event.event
    return event if isinstance(event, dict) else None  # type: ignore[return-value]


async def _turn(client: Client, turn_id: str) -> list[EventEnvelope]:
    """The turn's events this client took (own, or watched), up to its terminal."""

    def terminal(event: object) -> bool:
        envelope = _envelope(event)
        return envelope is not None and envelope["event"] == "turn.terminal"

    await _next(client, terminal)
    events = [_envelope(e) for e in SEEN[id(client)]]
    return [e for e in events if e is not None and e["payload"].get("turn_id") == turn_id]


async def test_a_watcher_sees_a_turn_and_its_approval_then_takes_control(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    SEEN.clear()
    write_settings(home, fake, approval_policy="ask")
    ctx = context(home, project, {"MC_DAEMON_CONTROL_REQUEST_SECONDS": "600"})
    owner = await Client.connect(ctx, client_name="owner", approvals=True)
    watcher = await Client.connect(ctx, client_name="watcher")
    try:
        for client in (owner, watcher):
            assert (await client.request("initialize", INITIALIZE))["error"] is None
        created = await owner.request("session.create", {})
        assert created["payload"] is not None
        session_id = created["payload"]["session_id"]

        history = await watcher.watch(session_id)
        assert (history["session_id"], history["items"], history["gap"]) == (
            session_id,
            [],
            False,
        )

        fake.enqueue(tool_reply(tool_call("s1", "shell", command="touch watched.txt")))
        fake.enqueue(Reply(text=["done"]))
        started = await owner.request(
            "turn.start", {"prompt": "make the file"}, session_id=session_id
        )
        assert started["payload"] is not None
        turn_id = started["payload"]["turn_id"]

        begun = await _next(watcher, _watched(TurnStarted))
        assert isinstance(begun, Watched) and isinstance(begun.event, TurnStarted)
        assert (begun.event.turn_id, begun.event.prompt) == (turn_id, "make the file")
        assert begun.event.by.startswith("owner#")

        # The watcher is told of the approval request; only the owner may answer it.
        asked = await _next(watcher, _watched(WatchedApproval))
        assert isinstance(asked, Watched) and isinstance(asked.event, WatchedApproval)
        request = asked.event.request
        assert request is not None and request.turn_id == turn_id
        assert request.summary["argv"] == ["touch", "watched.txt"]
        with pytest.raises(ApprovalError) as refused:
            await watcher.answer_approval(request.approval_id, "allow_once")
        assert refused.value.code == "unknown_approval"
        own = await _next(owner, lambda e: isinstance(e, ApprovalRequest))
        assert isinstance(own, ApprovalRequest) and own.approval_id == request.approval_id
        await owner.answer_approval(request.approval_id, "allow_once")
        settled = await _next(watcher, _watched(WatchedApproval))
        assert isinstance(settled, Watched) and isinstance(settled.event, WatchedApproval)
        assert settled.event.resolved is not None
        assert settled.event.turn_id == turn_id
        assert settled.event.resolved.approval_id == request.approval_id
        assert settled.event.resolved.decision == "allow_once"
        assert settled.event.resolved.by.startswith("owner#")

        owner_events = await _turn(owner, turn_id)
        watched = await _turn(watcher, turn_id)
        assert watched[0]["event"] == "turn.started"
        assert all(not isinstance(e, dict) for e in SEEN[id(watcher)])  # all Watched
        assert [e["payload"]["sequence"] for e in watched] == [
            e["payload"]["sequence"] for e in owner_events
        ]
        assert watched[-1]["payload"]["status"] == "completed"

        # Control on request: the owner is asked, grants; everyone is told.
        requesting = asyncio.create_task(watcher.request_control(session_id))
        ask = await _next(owner, lambda e: isinstance(e, ControlRequested))
        assert isinstance(ask, ControlRequested) and ask.session_id == session_id
        assert ask.by.startswith("watcher#") and ask.timeout_ms == 600_000
        await owner.answer_control(session_id, True)
        granted = await asyncio.wait_for(requesting, 30)
        assert (granted["session_id"], granted["turns"]) == (session_id, [])
        changed = await _next(owner, lambda e: isinstance(e, ControlChanged))
        assert changed == ControlChanged(session_id, ask.by)
        told = await _next(watcher, _watched(ControlChanged))
        assert isinstance(told, Watched) and told.event == ControlChanged(session_id, ask.by)
        with pytest.raises(ControlError) as nothing_waits:
            await owner.answer_control(session_id, True)
        assert nothing_waits.value.code == "invalid_request"

        # The old owner asks back and is refused.
        requesting = asyncio.create_task(owner.request_control(session_id))
        back = await _next(watcher, lambda e: isinstance(e, ControlRequested))
        assert isinstance(back, ControlRequested) and back.by.startswith("owner#")
        await watcher.answer_control(session_id, False)
        with pytest.raises(ControlRefused) as no:
            await asyncio.wait_for(requesting, 30)
        assert no.value.code == "control_refused"

        # Released: taken at once.
        await watcher.release_control(session_id)
        assert (await owner.take_control(session_id))["session_id"] == session_id

        # Watching again from the last cursor: the turn is history now.
        again = await watcher.watch(session_id, history["before_cursor"])
        texts = [item.get("text") for item in again["items"] if item["kind"] == "message"]
        assert texts == ["make the file", "done"]
        with pytest.raises(WatchError) as stale:
            await watcher.watch(session_id, STALE_CURSOR)
        assert stale.value.code == "resync_required"
        await watcher.unwatch(session_id)
    finally:
        await watcher.close()
        await owner.close()


def test_the_sync_client_watches_and_requests_control(home: Path, project: Path) -> None:
    ctx = context(home, project)
    with (
        SyncClient.connect(ctx, client_name="first", timeout=30) as first,
        SyncClient.connect(ctx, client_name="second", timeout=30) as second,
    ):
        for client in (first, second):
            assert client.request("initialize", INITIALIZE, timeout=30)["error"] is None
        created = first.request("session.create", {}, timeout=30)
        assert created["payload"] is not None
        session_id = created["payload"]["session_id"]
        assert second.watch(session_id, timeout=30)["items"] == []

        first.release_control(session_id, timeout=30)
        granted = second.request_control(session_id, timeout=30)
        assert granted["session_id"] == session_id
        changed = next(
            e for e in second.events(timeout=30) if isinstance(e, Watched)
        )  # released, then taken
        assert changed.event == ControlChanged(session_id, None)
        with pytest.raises(ControlError) as busy:
            first.take_control(session_id, timeout=30)
        assert busy.value.code == "session_busy"
        second.unwatch(session_id, timeout=30)
