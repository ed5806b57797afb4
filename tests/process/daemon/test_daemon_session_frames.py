"""The library, queue, steer and watch frames of a real daemon hold their JSON Schemas
(RFC-0002 §6.9 to §6.12, ``protocol.schema.session``): two raw connections drive every
one of them around a running turn, and the test ``Peer`` checks each frame it receives
against its document, the watcher's session events too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magi_code.client import connect_channel
from magi_code.protocol.schema.session import FRAMES
from tests.process.daemon.support import context, wait_for
from tests.process.turn_support import held_shell, tool_call, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.v2peer import Frame, Peer


async def _peer(home: Path, project: Path, name: str) -> Peer:
    channel = await connect_channel(
        context(home, project), "persistent", autostart=True, client_name=name
    )
    return await Peer.over(channel)


def _is(kind: str, **fields: Any) -> Any:
    return lambda f: f["t"] == kind and all(f.get(k) == v for k, v in fields.items())


async def test_the_session_frames_of_a_real_daemon_hold_their_schemas(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release, command = held_shell(project)
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("t1", "shell", command=command)]),
        Reply(text=["worked"]),
        Reply(text=["queued answer"]),
    )
    owner = await _peer(home, project, "owner")
    watcher = await _peer(home, project, "watcher")
    received: list[Frame] = []

    async def call(peer: Peer, frame: Frame, answer: str) -> Frame:
        got = await peer.call(frame, answer)
        received.append(got)
        return got

    try:
        created = await owner.request("session.create", {})
        session_id = created["payload"]["session_id"]
        base = {"session_id": session_id}
        await call(watcher, {"t": "watch", **base}, "watch_result")
        reply = await owner.request("turn.start", {"prompt": "work"}, session_id=session_id)
        assert reply["error"] is None, reply
        turn_id = reply["payload"]["turn_id"]
        await wait_for(started.exists, 60, "the tool to start")

        first = await call(owner, {"t": "queue_add", **base, "text": "next"}, "queue_result")
        second = await call(owner, {"t": "queue_add", **base, "text": "later"}, "queue_result")
        await call(owner, {"t": "queue_list", **base}, "queue_result")
        entry = {"entry_id": second["entry_id"]}
        moved = await call(owner, {"t": "queue_move", **base, **entry, "index": 0}, "queue_result")
        assert [e["entry_id"] for e in moved["entries"]] == [
            second["entry_id"],
            first["entry_id"],
        ]
        await call(owner, {"t": "queue_remove", **base, **entry}, "queue_result")
        await call(owner, {"t": "queue_remove", **base, **entry}, "queue_result")  # unknown
        await call(watcher, {"t": "queue_add", **base, "text": "x"}, "queue_result")  # not mine

        renamed = await call(
            owner, {"t": "session_rename", **base, "title": "Schema check"}, "session_result"
        )
        assert renamed["session"]["title"] == "Schema check"
        await call(owner, {"t": "session_archive", **base}, "session_result")
        await call(owner, {"t": "sessions_list", "archived": "all"}, "sessions_result")
        await call(owner, {"t": "session_unarchive", **base}, "session_result")
        await call(owner, {"t": "session_archive", "session_id": "../x"}, "session_error")

        await owner.channel.send({"t": "steer", "id": 900, "turn_id": turn_id, "text": "also"})
        await call(watcher, {"t": "steer", "turn_id": turn_id, "text": "x"}, "steer_result")
        release.touch()
        received.append(await owner.until(_is("steer_result", id=900), 60))
        # The queued entry runs once the turn ends: the watcher sees it taken off.
        await watcher.until(_is("watch_event", event="turn_started", prompt="next"), 60)
        await watcher.until(
            lambda f: (
                f["t"] == "watch_message"
                and f["message"]["event"] == "turn.terminal"
                and f["message"]["payload"]["turn_id"] != turn_id
            ),
            60,
        )
        await call(watcher, {"t": "unwatch", **base}, "unwatched")
        events = {f.get("event") for f in watcher.seen if f["t"] == "watch_event"}
        assert {"queue_changed", "title_changed"} <= events, events
        kinds = {f["t"] for f in received + owner.seen + watcher.seen}
        assert {
            "watch_result",
            "queue_result",
            "queue_error",
            "session_result",
            "session_error",
            "sessions_result",
            "steer_result",
            "steer_error",
            "unwatched",
        } <= kinds & set(FRAMES), kinds
    finally:
        await owner.close()
        await watcher.close()
