"""A persistent client's turn admission captures settings in the service's one preparation
worker, then checks the request's deadline and the client's hold on the session again
(RFC-0002 §6.6).

The daemon runs in this test's loop (in-memory transport, real domains and files). While
another process holds the global settings file's lock, as a writer does, a capture waits
for it; the test learns that a capture has begun from the real capture function, wrapped
to say so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon
from tests.support.settings_lock import settings_lock_held
from tests.support.v2peer import Frame, Peer

from magi_code.config.settings import Layer
from magi_code.core import turns
from magi_code.protocol import deadlines
from magi_code.storage.launch import LaunchContext
from magi_code.turns import runtime


@pytest.fixture
async def capture_started(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once an admission's settings capture has begun (the real capture runs)."""
    started = asyncio.Event()
    loop = asyncio.get_running_loop()
    capture = turns.prepare_settings

    def observed(ctx: LaunchContext, session: Layer | None = None) -> runtime.Prepared:
        loop.call_soon_threadsafe(started.set)
        return capture(ctx, session)

    monkeypatch.setattr(turns, "prepare_settings", observed)
    # A capture waits for the held lock as long as the test holds it.
    monkeypatch.setattr(runtime, "SETTINGS_LOCK_WAIT", 120.0)
    return started


async def _peer(daemon: InMemoryDaemon) -> Peer:
    return await Peer.over(await daemon.channel("persistent"))


def _answers(rid: str) -> Callable[[Frame], bool]:
    """The response to request ``rid``, or its ``request_error``."""

    def answers(frame: Frame) -> bool:
        if frame["t"] == "request_error":
            return bool(frame["request_id"] == rid)
        message = frame.get("message", {})
        return (
            frame["t"] == "message"
            and message.get("kind") == "response"
            and (message.get("request_id") == rid)
        )

    return answers


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def _user_prompts(peer: Peer, session_id: str) -> list[str]:
    replay = await peer.request("session.replay", {}, session_id=session_id)
    events = replay["payload"]["events"]
    return [e["text"] for e in events if e["kind"] == "message" and e["role"] == "user"]


async def test_a_capture_or_write_that_overlaps_a_capture_is_busy_not_queued(
    daemon: InMemoryDaemon, fake: FakeProviderServer, home: Path, capture_started: asyncio.Event
) -> None:
    fake.enqueue(Reply(text=["first"]))
    fake.enqueue(Reply(text=["second"]))
    first, second = await _peer(daemon), await _peer(daemon)
    with settings_lock_held(home / "settings.json") as lock:
        rid = await first.send_request("turn.start", {"prompt": "one"})
        await asyncio.wait_for(capture_started.wait(), 20)
        overlapping = await second.request("turn.start", {"prompt": "two"})
        assert overlapping["error"]["code"] == "configuration_busy", overlapping
        write = await second.request("config.set", {"scope": "global", "fast": True})
        assert write["error"]["code"] == "configuration_busy", write
        lock.release()
        accepted = (await first.until(_answers(rid)))["message"]
    assert accepted["error"] is None, accepted
    terminal = (await first.turn_events(accepted["payload"]["turn_id"]))[-1]
    assert terminal["payload"]["status"] == "completed"
    again = await second.request("turn.start", {"prompt": "two"})
    assert again["error"] is None, again
    terminal = (await second.turn_events(again["payload"]["turn_id"]))[-1]
    assert terminal["payload"]["assistant_text"] == "second"
    await first.close()
    await second.close()


async def test_a_start_whose_deadline_passes_during_the_capture_does_not_run(
    daemon: InMemoryDaemon,
    fake: FakeProviderServer,
    home: Path,
    capture_started: asyncio.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.enqueue(Reply(text=["later"]))
    peer = await _peer(daemon)
    session_id = (await peer.request("session.create", {}))["payload"]["session_id"]
    with settings_lock_held(home / "settings.json") as lock:
        # Far enough ahead that the daemon reaches the request before it (else it would
        # expire unrun without a capture, and the wait below fails)...
        deadline_ms = int(time.time() * 1000) + 60_000
        rid = await peer.send_request(
            "turn.start", {"prompt": "expired"}, session_id=session_id, deadline_ms=deadline_ms
        )
        await asyncio.wait_for(capture_started.wait(), 20)
        # ...and passed while the capture waits: the deadline checks' clock moves on.
        later = SimpleNamespace(time=lambda: time.time() + 120)
        monkeypatch.setattr(deadlines, "time", later)
        lock.release()
        answer = await peer.until(_answers(rid))
    assert answer["t"] == "request_error", answer
    assert answer["code"] == "deadline_exceeded"
    # Nothing was kept: the request ID is free, the session holds no prompt, and it takes
    # the next start.
    retried = await peer.request("turn.start", {"prompt": "in time"}, session_id=session_id)
    assert retried["error"] is None, retried
    await peer.turn_events(retried["payload"]["turn_id"])
    assert await _user_prompts(peer, session_id) == ["in time"]
    assert len(fake.requests) == 1
    await peer.close()


async def test_control_taken_during_the_capture_refuses_the_lost_clients_start(
    daemon: InMemoryDaemon, fake: FakeProviderServer, home: Path, capture_started: asyncio.Event
) -> None:
    fake.enqueue(Reply(text=["taker's"]))
    owner = await _peer(daemon)
    session_id = (await owner.request("session.create", {}))["payload"]["session_id"]
    with settings_lock_held(home / "settings.json") as lock:
        await owner.send_request("turn.start", {"prompt": "lost"}, session_id=session_id)
        await asyncio.wait_for(capture_started.wait(), 20)
        await owner.close()
        taker = await _peer(daemon)
        # The lost client's control is revoked at once, while its start still waits.
        granted = await taker.call(
            {"t": "take_control", "session_id": session_id}, "control_granted"
        )
        assert granted["t"] == "control_granted", granted
        assert granted["turns"] == []
        lock.release()
    await _until(lambda: daemon.server.clients() == 1)  # the lost client's start ended
    started = await taker.request("turn.start", {"prompt": "mine"}, session_id=session_id)
    assert started["error"] is None, started
    await taker.turn_events(started["payload"]["turn_id"])
    assert await _user_prompts(taker, session_id) == ["mine"]
    assert len(fake.requests) == 1
    await taker.close()
