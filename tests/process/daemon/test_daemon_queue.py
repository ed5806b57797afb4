"""The prompt queue (RFC-0002 §6.12) through a real daemon and the fake provider: queued
prompts run in order as normal turns (watchers see them, replay has them) after the
client that queued them is gone and after ``daemon restart``; a late steer goes to the
head of the queue; only the controller changes a queue; bad input and the bounds are
fixed errors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from magi_code.client import (
    Client,
    QueueChanged,
    QueueError,
    SteerError,
    SyncClient,
    TitleChanged,
    TurnStarted,
    Watched,
    connect_channel,
)
from tests.process.daemon.support import (
    context,
    persistent,
    replay_in_new_shim,
    status,
    wait_for,
)
from tests.process.turn_support import held_shell, tool_call, write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.v2peer import Peer

PROMPTS = ["first queued", "second queued", "third queued"]


def _blocking_turn(fake: FakeProviderServer, project: Path) -> tuple[Path, Path]:
    """Enqueue a turn whose shell tool waits for ``release``: ``(started, release)``."""
    started, release, command = held_shell(project)
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("t1", "shell", command=command)]),
        Reply(text=["worked"]),
    )
    return started, release


async def _watched_turns(
    watcher: Client, count: int, *, before: tuple[str, ...] = ()
) -> tuple[list[TurnStarted], list[Any]]:
    """The watcher's next ``count`` turns (their ``turn_started``) and every session event
    seen until their terminals, each of them completed; turns started with a prompt in
    ``before`` (started earlier) are passed over."""
    started: list[TurnStarted] = []
    seen: list[Any] = []
    ended = 0
    async with asyncio.timeout(90):
        while ended < count:
            event = await watcher.next_event()
            assert event is not None, "the watcher's connection ended"
            if not isinstance(event, Watched):
                continue
            seen.append(event.event)
            if isinstance(event.event, TurnStarted) and event.event.prompt not in before:
                started.append(event.event)
            elif isinstance(event.event, dict) and event.event["event"] == "turn.terminal":
                payload = event.event["payload"]
                if payload["turn_id"] in {t.turn_id for t in started}:
                    assert payload["status"] == "completed", payload
                    ended += 1
    return started, seen


def _user_texts(replay: list[dict[str, Any]]) -> list[str]:
    return [i["text"] for i in replay if i["kind"] == "message" and i.get("role") == "user"]


async def test_queued_prompts_run_in_order_after_the_client_that_queued_them_is_gone(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release = _blocking_turn(fake, project)
    fake.enqueue(*(Reply(text=[f"answer {i}"]) for i in range(3)))
    client = await persistent(home, project)
    watcher = await persistent(home, project)
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        await watcher.watch(session_id)
        reply = await client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        assert reply["error"] is None, reply
        await wait_for(started.exists, 60, "the tool to start")
        added = [await client.queue_add(session_id, prompt) for prompt in PROMPTS]
        listed = await watcher.queue_list(session_id)
        assert [e["text"] for e in listed] == PROMPTS
        assert [e["entry_id"] for e in listed] == [e["entry_id"] for e in added]
        assert len({e["by"] for e in listed}) == 1 and "#" in listed[0]["by"]
        # A watcher reads the queue; only the controller changes it.
        with pytest.raises(QueueError) as refused:
            await watcher.queue_add(session_id, "not mine")
        assert refused.value.code == "not_controller"
        with pytest.raises(QueueError) as refused:
            await watcher.queue_remove(session_id, added[0]["entry_id"])
        assert refused.value.code == "not_controller"
    finally:
        await client.close()  # the queue outlives the client that filled it
    try:
        release.touch()
        turns, seen = await _watched_turns(watcher, 4)
    finally:
        await watcher.close()

    assert [t.prompt for t in turns] == ["work", *PROMPTS]
    assert all(t.by.startswith("queue#") for t in turns[1:]), turns
    # The watcher saw each entry added, then each queued turn take its entry off.
    changes = [e.entries for e in seen if isinstance(e, QueueChanged)]
    assert [len(c) for c in changes] == [1, 2, 3, 2, 1, 0], changes
    assert [e["text"] for e in changes[3]] == PROMPTS[1:]

    replay = await replay_in_new_shim(home, project, session_id)
    assert _user_texts(replay) == ["work", *PROMPTS]
    assistant = [i["text"] for i in replay if i.get("role") == "assistant"]
    assert assistant == ["worked", "answer 0", "answer 1", "answer 2"]
    # Each queued turn's request carried the history before it, in order.
    bodies = [r.json for r in fake.requests if r.path.endswith("/completions")]
    assert len(bodies) == 5
    assert bodies[-1]["messages"][-1] == {"role": "user", "content": PROMPTS[2]}


async def test_the_queue_survives_a_daemon_restart_and_resumes_when_served(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release = _blocking_turn(fake, project)
    fake.enqueue(*(Reply(text=[f"answer {i}"]) for i in range(3)))
    client = await persistent(home, project)
    old_pid = status(home)["pid"]
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        reply = await client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        assert reply["error"] is None, reply
        await wait_for(started.exists, 60, "the tool to start")
        for prompt in PROMPTS:
            await client.queue_add(session_id, prompt)
    finally:
        await client.close()
    restart = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magi_code",
        "daemon",
        "restart",
        env=context(home, project).env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await wait_for(lambda: status(home).get("restart_pending") is True, 30, "restart_pending")
        release.touch()
        _, err = await asyncio.wait_for(restart.communicate(), 90)
        assert restart.returncode == 0, err
    finally:
        if restart.returncode is None:
            restart.kill()
            await restart.wait()
    assert status(home)["pid"] != old_pid
    # The old daemon started no queued turn while it waited to restart; the queue is on
    # disk, whole and in order.
    assert len([r for r in fake.requests if r.path.endswith("/completions")]) == 2
    stored = json.loads((home / "sessions" / session_id / "queue.json").read_text())
    assert [e["text"] for e in stored["entries"]] == PROMPTS

    # The new daemon resumes the queue when it next serves the session (here: a watch).
    watcher = await persistent(home, project)
    try:
        await watcher.watch(session_id)
        turns, _ = await _watched_turns(watcher, 3)
        assert [t.prompt for t in turns] == PROMPTS
        assert await watcher.queue_list(session_id) == []
    finally:
        await watcher.close()
    replay = await replay_in_new_shim(home, project, session_id)
    assert _user_texts(replay) == ["work", *PROMPTS]


async def test_a_late_steer_goes_to_the_head_of_the_queue(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, _ = _blocking_turn(fake, project)
    fake.enqueue(Reply(text=["steered turn"]), Reply(text=["queued turn"]))
    client = await persistent(home, project)
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        await client.watch(session_id)
        reply = await client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        turn_id = reply["payload"]["turn_id"]
        await wait_for(started.exists, 60, "the tool to start")
        await client.queue_add(session_id, "queued before")
        steer = asyncio.create_task(client.steer(turn_id, "too late"))
        await client.status()  # a round trip: the daemon took the steer
        # The turn ends before a request boundary (cancelled in its tool call).
        cancel = await client.request("turn.cancel", {"turn_id": turn_id})
        assert cancel["error"] is None, cancel
        with pytest.raises(SteerError) as late:
            await asyncio.wait_for(steer, 60)
        assert late.value.code == "turn_finished"
        assert late.value.entry_id is not None
        turns, seen = await _watched_turns(client, 2, before=("work",))
    finally:
        await client.close()
    assert [t.prompt for t in turns] == ["too late", "queued before"]
    changes = [
        [(x["entry_id"], x["text"]) for x in e.entries] for e in seen if isinstance(e, QueueChanged)
    ]
    entry_id = late.value.entry_id
    assert changes[:2] == [
        [(changes[0][0][0], "queued before")],
        [(entry_id, "too late"), (changes[0][0][0], "queued before")],
    ], changes
    replay = await replay_in_new_shim(home, project, session_id)
    assert _user_texts(replay) == ["work", "too late", "queued before"]


async def test_queue_changes_and_their_errors(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release = _blocking_turn(fake, project)
    client = await persistent(home, project)
    channel = await connect_channel(context(home, project), "persistent", autostart=True)
    raw = await Peer.over(channel)
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        reply = await client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        assert reply["error"] is None, reply
        await wait_for(started.exists, 60, "the tool to start")
        a = await client.queue_add(session_id, "a")
        b = await client.queue_add(session_id, "b")
        c = await client.queue_add(session_id, "c")
        moved = await client.queue_move(session_id, b["entry_id"], 0)
        assert [e["text"] for e in moved] == ["b", "a", "c"]
        moved = await client.queue_move(session_id, b["entry_id"], 99)
        assert [e["text"] for e in moved] == ["a", "c", "b"]
        left = await client.queue_remove(session_id, c["entry_id"])
        assert [e["text"] for e in left] == ["a", "b"]
        for call in (
            client.queue_remove(session_id, c["entry_id"]),
            client.queue_move(session_id, "q_nope", 0),
            client.queue_send_now(session_id, "q_nope"),
        ):
            with pytest.raises(QueueError) as unknown:
                await call
            assert unknown.value.code == "unknown_entry"

        # Bad arguments are invalid_request, answered without running.
        sid = session_id
        for frame in (
            {"t": "queue_add", "session_id": sid, "text": "   "},
            {"t": "queue_add", "session_id": sid, "text": "x" * 16_385},
            {"t": "queue_add", "session_id": sid},
            {"t": "queue_list"},
            {"t": "queue_remove", "session_id": sid, "entry_id": 3},
            {"t": "queue_move", "session_id": sid, "entry_id": a["entry_id"], "index": -1},
            {"t": "queue_move", "session_id": sid, "entry_id": a["entry_id"], "index": True},
            {"t": "queue_send_now", "session_id": sid},
        ):
            answer = await raw.call(frame, "queue_result")
            assert answer == {"t": "queue_error", "id": answer["id"], "code": "invalid_request"}
        unknown_session = await raw.call(
            {"t": "queue_list", "session_id": "../etc"}, "queue_result"
        )
        assert unknown_session["code"] == "invalid_session_id"

        # Bounds: at most 32 entries, and 256 KiB of text in all.
        for i in range(30):
            await client.queue_add(session_id, f"filler {i}")
        with pytest.raises(QueueError) as full:
            await client.queue_add(session_id, "one too many")
        assert full.value.code == "limit_exceeded"
        entries = await client.queue_list(session_id)
        for entry in entries[2:]:
            await client.queue_remove(session_id, entry["entry_id"])
        for _ in range(15):
            await client.queue_add(session_id, "y" * 16_384)
        with pytest.raises(QueueError) as full:
            await client.queue_add(session_id, "y" * 16_384)
        assert full.value.code == "limit_exceeded"
        for entry in (await client.queue_list(session_id))[2:]:
            await client.queue_remove(session_id, entry["entry_id"])

        # send_now with a turn running steers the entry into it, at its next request
        # boundary (after the tool call in flight); then it leaves the queue.
        await client.queue_remove(session_id, a["entry_id"])
        sent = asyncio.create_task(client.queue_send_now(session_id, b["entry_id"]))
        await client.status()  # a round trip: the daemon took it
        assert not sent.done()
        release.touch()
        assert await asyncio.wait_for(sent, 60) == []
    finally:
        release.touch()
        await raw.close()
        await client.close()

    # The entry left the queue when the turn took it; the request carrying it follows
    # once the released tool call has ended.
    def steered() -> bool:
        bodies = [r.json for r in fake.requests if r.path.endswith("/completions")]
        return bodies[-1]["messages"][-1] == {"role": "user", "content": "b"}

    await wait_for(steered, 60, "the request carrying the steered entry")
    replay = await replay_in_new_shim(home, project, session_id)
    assert _user_texts(replay) == ["work", "b"]


async def test_a_watcher_sees_the_session_renamed(home: Path, project: Path) -> None:
    client = await persistent(home, project)
    watcher = await persistent(home, project)
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        await watcher.watch(session_id)
        await client.rename_session(session_id, "Parser\nrewrite")
        async with asyncio.timeout(30):
            while True:
                event = await watcher.next_event()
                assert event is not None
                if isinstance(event, Watched) and isinstance(event.event, TitleChanged):
                    break
        assert event.event == TitleChanged(session_id, "Parser rewrite")
    finally:
        await watcher.close()
        await client.close()


async def test_send_now_after_the_turn_ended_puts_the_entry_at_the_head(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, _ = _blocking_turn(fake, project)
    fake.enqueue(Reply(text=["sent"]), Reply(text=["other"]))
    client = await persistent(home, project)
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        reply = await client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        turn_id = reply["payload"]["turn_id"]
        await wait_for(started.exists, 60, "the tool to start")
        await client.queue_add(session_id, "other")
        sent = await client.queue_add(session_id, "send me")
        sending = asyncio.create_task(client.queue_send_now(session_id, sent["entry_id"]))
        await client.status()  # a round trip: the daemon took it
        await client.watch(session_id)
        await client.request("turn.cancel", {"turn_id": turn_id})
        with pytest.raises(QueueError) as ended:
            await asyncio.wait_for(sending, 60)
        assert ended.value.code == "turn_finished"
        turns, _ = await _watched_turns(client, 2, before=("work",))
    finally:
        await client.close()
    assert [t.prompt for t in turns] == ["send me", "other"]


def test_sync_client_queue(home: Path, project: Path, fake: FakeProviderServer) -> None:
    write_settings(home, fake)
    started, release = _blocking_turn(fake, project)
    fake.enqueue(Reply(text=["b done"]))
    with SyncClient.connect(context(home, project)) as client:
        init = client.request("initialize", {"supported_protocol_versions": [1]})
        assert init["error"] is None
        session_id = client.request("session.create", {})["payload"]["session_id"]
        reply = client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        assert reply["error"] is None, reply
        asyncio.run(wait_for(started.exists, 60, "the tool to start"))
        a = client.queue_add(session_id, "a")
        b = client.queue_add(session_id, "b")
        moved = client.queue_move(session_id, b["entry_id"], 0)
        assert [e["text"] for e in moved] == ["b", "a"]
        assert client.queue_remove(session_id, a["entry_id"]) == [b]
        assert client.queue_list(session_id) == [b]
        with pytest.raises(QueueError) as unknown:
            client.queue_send_now(session_id, a["entry_id"])
        assert unknown.value.code == "unknown_entry"
        client.watch(session_id)
        release.touch()
        started_turns: dict[str, str] = {}
        for event in client.events(timeout=60):
            if isinstance(event, Watched) and isinstance(event.event, TurnStarted):
                started_turns[event.event.turn_id] = event.event.prompt
            elif (
                isinstance(event, Watched)
                and isinstance(event.event, dict)
                and event.event["event"] == "turn.terminal"
                and started_turns.get(event.event["payload"]["turn_id"]) == "b"
            ):
                assert event.event["payload"]["assistant_text"] == "b done"
                break
        # The running turn (live from the watch on), then the queued one.
        assert list(started_turns.values()) == ["work", "b"]


async def test_a_client_takes_control_of_a_queued_turn_running_without_one(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """A queued turn running after its client left is held like a lost client's: another
    client's ``control_request`` is granted at once, with the turn, which it may cancel;
    it then controls the queue."""
    write_settings(home, fake)
    started, release = _blocking_turn(fake, project)
    queued_started = project / "queued-started"
    command = f"touch {queued_started}; sleep 600"
    fake.enqueue(
        Reply(text=[], tool_calls=[FakeToolCall("t2", "shell", json.dumps({"command": command}))])
    )
    client = await persistent(home, project)
    try:
        session_id = (await client.request("session.create", {}))["payload"]["session_id"]
        reply = await client.request("turn.start", {"prompt": "work"}, session_id=session_id)
        assert reply["error"] is None, reply
        await wait_for(started.exists, 60, "the tool to start")
        await client.queue_add(session_id, "long queued")
        await client.queue_add(session_id, "later")
    finally:
        await client.close()
    release.touch()
    await wait_for(queued_started.exists, 60, "the queued turn's tool to start")
    other = await persistent(home, project)
    try:
        with pytest.raises(QueueError) as refused:
            await other.queue_remove(session_id, "q_nope")
        assert refused.value.code == "not_controller"
        granted = await asyncio.wait_for(other.request_control(session_id), 30)
        assert len(granted["turns"]) == 1
        turn_id = granted["turns"][0]["turn_id"]
        [later] = await other.queue_list(session_id)
        assert later["text"] == "later"
        assert await other.queue_remove(session_id, later["entry_id"]) == []
        await other.attach(turn_id)
        cancel = await other.request("turn.cancel", {"turn_id": turn_id})
        assert cancel["error"] is None, cancel
        async with asyncio.timeout(60):
            while True:
                event = await other.next_event()
                assert event is not None
                if isinstance(event, dict) and event["event"] == "turn.terminal":
                    assert event["payload"]["status"] == "cancelled"
                    break
    finally:
        await other.close()
    replay = await replay_in_new_shim(home, project, session_id)
    assert _user_texts(replay) == ["work", "long queued"]
