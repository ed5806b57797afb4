"""Bounded answers, outcomes that outlive the daemon, and safe retries, against a real daemon.

Every client here is a raw v2 ``persistent`` connection over the real socket (the daemon
started on demand, as for any frontend), so these pin RFC-0002's wire behaviour.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import msgpack
import pytest

from magi_code.client import connect_channel
from magi_code.core.persistent import RECOVERED_SEQUENCE
from magi_code.protocol.frames import MAX_FRAME_BYTES
from magi_code.turns.failures import REMEDIES
from tests.process.daemon.support import context, replay_in_new_shim, status, wait_for
from tests.process.turn_support import start_turn, write_settings
from tests.support import wire_schema
from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.service import ServiceProcess
from tests.support.v2peer import Frame, Peer, sequences


async def _peer(home: Path, project: Path, **extra: str) -> Peer:
    channel = await connect_channel(context(home, project, extra), "persistent", autostart=True)
    return await Peer.over(channel)


async def _finished(peer: Peer, turn_id: str, session_id: str) -> Frame:
    """The terminal the daemon answers for a turn of ``session_id`` (attach, by session)."""
    answer, events = await peer.attach(turn_id, -1, session_id=session_id)
    assert answer["status"] == "finished", answer
    assert events[-1]["event"] == "turn.terminal"
    terminal: Frame = events[-1]["payload"]
    return terminal


async def test_sixty_16_kib_answers_page_through_snapshot_on_one_connection(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    answer = "ü" * 8000  # 16,000 bytes of UTF-8
    peer = await _peer(home, project)
    try:
        started = []
        for _ in range(60):
            fake.enqueue(Reply(text=[answer]))
            response = await peer.request("turn.start", {"prompt": "long"})
            started.append(response["payload"]["turn_id"])
            await peer.turn_events(started[-1])
        seen: list[Frame] = []
        cursor = None
        pages = 0
        while True:
            frame: Frame = {"t": "snapshot", "project_dir": str(project)}
            if cursor is not None:
                frame["cursor"] = cursor
            page = await peer.call(frame, "snapshot_result")
            assert page["t"] == "snapshot_result", page
            assert len(msgpack.packb(page)) < MAX_FRAME_BYTES
            seen += page["turns"]
            pages += 1
            if (cursor := page["next_cursor"]) is None:
                break
        assert pages > 1
        assert [item["turn_id"] for item in seen] == started  # each once, in order
        assert all(item["assistant_text"] == answer for item in seen)
        other = await peer.call({"t": "snapshot", "project_dir": "/elsewhere"}, "snapshot_result")
        assert other["turns"] == [] and other["next_cursor"] is None
        # The connection is still healthy after all of it.
        assert (await peer.request("status", {}))["error"] is None
    finally:
        await peer.close()


async def test_a_512_event_attach_delivers_every_event_in_order(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["y"] * 700, ending="stall", after_chunks=600))
    owner = await _peer(home, project)
    follower = await _peer(home, project)
    try:
        response = await owner.request("turn.start", {"prompt": "many"})
        turn_id = response["payload"]["turn_id"]
        deltas, last = 0, -1
        while deltas < 600:
            frame = await owner.until(lambda f: f["t"] == "message")
            deltas += frame["message"].get("event") == "turn.assistant_delta"
            last = frame["message"]["payload"]["sequence"]
        answer, events = await follower.attach(turn_id, last - 512)
        assert answer["status"] == "attached"
        assert sequences(events) == list(range(last - 511, last + 1))
        assert (await owner.request("turn.cancel", {"turn_id": turn_id}))["error"] is None
        live = await follower.turn_events(turn_id)
        assert live[-1]["payload"]["status"] == "cancelled"
        assert sequences(live)[0] > last
    finally:
        await owner.close()
        await follower.close()


async def _completed_turn(peer: Peer, fake: FakeProviderServer) -> tuple[str, str, Frame]:
    fake.enqueue(Reply(text=["durable ", "answer"]))
    response = await peer.request("turn.start", {"prompt": "keep"})
    turn_id, session_id = response["payload"]["turn_id"], response["payload"]["session_id"]
    terminal = (await peer.turn_events(turn_id))[-1]["payload"]
    return turn_id, session_id, terminal


async def test_an_outcome_is_answered_after_idle_stop(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    peer = await _peer(home, project, MC_DAEMON_IDLE_SECONDS="1")
    turn_id, session_id, terminal = await _completed_turn(peer, fake)
    first_pid = status(home)["pid"]
    await peer.close()
    await wait_for(lambda: not status(home)["running"], 30, "the idle stop")
    peer = await _peer(home, project)  # starts a new daemon on demand
    try:
        assert status(home)["pid"] != first_pid
        assert await _finished(peer, turn_id, session_id) == terminal
    finally:
        await peer.close()


async def test_an_outcome_is_answered_after_daemon_stop(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    from tests.process.daemon.support import cli

    write_settings(home, fake)
    peer = await _peer(home, project)
    turn_id, session_id, terminal = await _completed_turn(peer, fake)
    await peer.close()
    assert (await asyncio.to_thread(cli, home, "daemon", "stop")).returncode == 0
    peer = await _peer(home, project)
    try:
        assert await _finished(peer, turn_id, session_id) == terminal
        # Without the session the new daemon cannot know the turn.
        unknown = await peer.call({"t": "attach", "turn_id": turn_id}, "attach_result")
        assert unknown["t"] == "attach_error" and unknown["code"] == "unknown_turn"
    finally:
        await peer.close()


async def test_after_kill_9_a_finished_turn_keeps_its_outcome_and_a_running_one_fails(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    peer = await _peer(home, project)
    done_id, session_id, terminal = await _completed_turn(peer, fake)
    fake.enqueue(Reply(text=["half ", "way"], ending="stall", after_chunks=2))
    response = await peer.request("turn.start", {"prompt": "hang"}, session_id=session_id)
    assert response["error"] is None, response
    running_id = response["payload"]["turn_id"]
    deltas = 0
    while deltas < 2:
        frame = await peer.until(lambda f: f["t"] == "message")
        deltas += frame["message"].get("event") == "turn.assistant_delta"
    os.kill(status(home)["pid"], signal.SIGKILL)
    await wait_for(lambda: not status(home)["running"], 30, "the daemon to die")
    await peer.close()
    peer = await _peer(home, project)  # the next client starts a new daemon
    try:
        assert await _finished(peer, done_id, session_id) == terminal
        failed = await _finished(peer, running_id, session_id)
        assert failed["status"] == "failed" and failed["turn_id"] == running_id
        assert failed["failure"] == "service_interrupted"
        assert failed["remedy"] == REMEDIES["service_interrupted"]
        assert "half" in failed["assistant_text"] or failed["assistant_text"] == ""
        # Asked again, the recovered terminal is the same (it is durable now).
        assert await _finished(peer, running_id, session_id) == failed
    finally:
        await peer.close()
    items = await replay_in_new_shim(home, project, session_id)
    assert [i["status"] for i in items if i["kind"] == "terminal"] == ["completed", "failed"]


@pytest.mark.parametrize("holder", ["persistent", "v1_shim"])
async def test_after_kill_9_a_client_that_opened_the_session_gets_its_dead_turn_finished(
    home: Path, project: Path, fake: FakeProviderServer, holder: str
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["half ", "way"], ending="stall", after_chunks=2))
    peer = await _peer(home, project)
    response = await peer.request("turn.start", {"prompt": "hang"})
    wire_schema.check_record(response)
    turn_id, session_id = response["payload"]["turn_id"], response["payload"]["session_id"]
    deltas = 0
    while deltas < 2:
        frame = await peer.until(lambda f: f["t"] == "message")
        wire_schema.check_record(frame["message"])
        deltas += frame["message"].get("event") == "turn.assistant_delta"
    os.kill(status(home)["pid"], signal.SIGKILL)
    await wait_for(lambda: not status(home)["running"], 30, "the daemon to die")
    await peer.close()
    peer = await _peer(home, project)  # a new daemon
    shim = None
    try:
        # This daemon's own client holds the session's lease before anyone asks.
        if holder == "persistent":
            opened = await peer.request("session.open", {}, session_id=session_id)
            wire_schema.check_record(opened)
        else:
            shim = await ServiceProcess.start(home, project)  # checks its records itself
            await shim.initialize()
            opened = await shim.request("session.open", {}, session_id=session_id)
        assert opened["error"] is None, opened
        answer, events = await peer.attach(turn_id, -1, session_id=session_id)
        assert answer["t"] == "attach_result", answer  # not session_busy
        assert (answer["status"], answer["failure"]) == ("finished", "service_interrupted")
        (event,) = events
        wire_schema.check("envelope.event", event)
        wire_schema.check("event.turn.terminal", event["payload"])
        terminal = event["payload"]
        assert (terminal["turn_id"], terminal["status"]) == (turn_id, "failed")
        assert terminal["sequence"] == RECOVERED_SEQUENCE
        assert "half" in terminal["assistant_text"] or terminal["assistant_text"] == ""
        # The holder goes on with the session.
        fake.enqueue(Reply(text=["next"]))
        if shim is None:
            started = await peer.request("turn.start", {"prompt": "go"}, session_id=session_id)
            wire_schema.check_record(started)
            last = (await peer.turn_events(started["payload"]["turn_id"]))[-1]
            wire_schema.check_record(last)
        else:
            rid, _ = await start_turn(shim, "go", session_id=session_id)
            last = (await shim.events_until_terminal(rid))[-1]
        assert last["payload"]["status"] == "completed"
    finally:
        if shim is not None:
            await shim.close_stdin()
            await shim.wait()
        await peer.close()
    items = await replay_in_new_shim(home, project, session_id)
    assert [i["status"] for i in items if i["kind"] == "terminal"] == ["failed", "completed"]


async def test_a_failed_turns_reason_is_the_same_in_its_terminal_snapshot_and_attach(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    from tests.process.daemon.support import cli

    write_settings(home, fake)
    fake.set_default(HttpError(401))
    peer = await _peer(home, project)
    try:
        response = await peer.request("turn.start", {"prompt": "refused"})
        turn_id, session_id = response["payload"]["turn_id"], response["payload"]["session_id"]
        terminal = (await peer.turn_events(turn_id))[-1]["payload"]
        assert (terminal["status"], terminal["failure"]) == ("failed", "provider_auth_failed")
        answer, events = await peer.attach(turn_id, -1)
        assert answer["failure"] == "provider_auth_failed"
        assert events[-1]["payload"] == terminal
        snapshot = await peer.call({"t": "snapshot", "turn_ids": [turn_id]}, "snapshot_result")
        (item,) = snapshot["turns"]
        assert item["failure"] == "provider_auth_failed"
        assert {**item["terminal"], "assistant_text": ""} == terminal
    finally:
        await peer.close()
    # A new daemon answers from the session: the reason was recorded with the terminal.
    assert (await asyncio.to_thread(cli, home, "daemon", "stop")).returncode == 0
    peer = await _peer(home, project)
    try:
        answer, events = await peer.attach(turn_id, -1, session_id=session_id)
        assert (answer["status"], answer["failure"]) == ("finished", "provider_auth_failed")
        durable = events[-1]["payload"]
        assert (durable["failure"], durable["remedy"]) == (terminal["failure"], terminal["remedy"])
    finally:
        await peer.close()


async def test_a_retried_start_after_a_dropped_connection_runs_the_prompt_once(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["only ", "once"], chunk_delay=0.05))
    fake.set_default(Reply(text=["a second run"]))
    first = await _peer(home, project)
    await first.send_request("turn.start", {"prompt": "p"}, idempotency_key="retry:1")
    await first.close()  # dropped before the answer arrived: the outcome is unknown
    retry = await _peer(home, project)
    try:
        response = await retry.request("turn.start", {"prompt": "p"}, idempotency_key="retry:1")
        assert response["error"] is None
        turn_id = response["payload"]["turn_id"]
        answer, events = await retry.attach(turn_id, -1)
        if answer["status"] != "finished":
            events += await retry.turn_events(turn_id)
        assert events[-1]["payload"]["assistant_text"] == "only once"
        snapshot = await retry.call({"t": "snapshot", "turn_ids": [turn_id]}, "snapshot_result")
        (item,) = snapshot["turns"]
        assert item["idempotency_key"] == "retry:1"
    finally:
        await retry.close()
    assert len([r for r in fake.requests if r.method == "POST"]) == 1
