"""One live session across several UIs (RFC-0002 §6.1, §6.9), three real connections
to one daemon: two persistent clients and a v1 shim. A watcher sees the history of a
session, then a turn the shim starts from its first event; control is handed over on
request (the controller grants) and by the request's timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magi_code.client import connect_channel
from tests.process.daemon.support import context
from tests.process.turn_support import start_turn, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess
from tests.support.v2peer import Frame, Peer

TIMEOUT_ENV = {"MC_DAEMON_CONTROL_REQUEST_SECONDS": "1"}


async def _peer(home: Path, project: Path, name: str) -> Peer:
    channel = await connect_channel(
        context(home, project, TIMEOUT_ENV), "persistent", autostart=True, client_name=name
    )
    return await Peer.over(channel)


def _is(kind: str, **fields: Any) -> Any:
    return lambda f: f["t"] == kind and all(f.get(k) == v for k, v in fields.items())


async def _watched_turn(watcher: Peer, turn_id: str) -> list[Frame]:
    events: list[Frame] = []
    while not events or events[-1]["event"] != "turn.terminal":
        frame = await watcher.until(
            lambda f: f["t"] == "watch_message" and f["message"]["payload"]["turn_id"] == turn_id
        )
        events.append(frame["message"])
    return events


async def test_a_watcher_sees_history_then_a_shim_turn_from_its_first_event(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["first ", "answer"]))
    fake.enqueue(Reply(text=["second ", "answer"]))
    shim = await ServiceProcess.start(home, project)
    watcher = None
    try:
        await shim.initialize()
        rid, first = await start_turn(shim, "before the watch")
        session_id = first["session_id"]
        await shim.events_until_terminal(rid)

        watcher = await _peer(home, project, "watcher")
        answer = await watcher.call({"t": "watch", "session_id": session_id}, "watch_result")
        assert answer["t"] == "watch_result", answer
        history = answer["events"]
        assert [(e["kind"], e.get("role"), e.get("text")) for e in history] == [
            ("message", "user", "before the watch"),
            ("message", "assistant", "first answer"),
            ("terminal", None, None),
        ]
        assert answer["more"] is False

        rid, second = await start_turn(shim, "while watched", session_id=session_id)
        started = await watcher.until(_is("watch_event", event="turn_started"))
        assert started["turn_id"] == second["turn_id"]
        assert started["prompt"] == "while watched"
        assert started["by"].startswith("shim#")
        events = await _watched_turn(watcher, second["turn_id"])
        assert events[0]["event"] == "turn.started"
        assert [e["payload"]["sequence"] for e in events] == sorted(
            {e["payload"]["sequence"] for e in events}
        )
        assert events[-1]["payload"]["assistant_text"] == "second answer"
        shim_events = await shim.events_until_terminal(rid)
        assert [e["payload"]["sequence"] for e in events] == [
            e["payload"]["sequence"] for e in shim_events
        ]

        # Watching again from the last history cursor: the watched turn is history now.
        again = await watcher.call(
            {"t": "watch", "session_id": session_id, "after_cursor": history[-1]["cursor"]},
            "watch_result",
        )
        assert [e.get("text") for e in again["events"]] == ["while watched", "second answer", None]

        unwatched = await watcher.call({"t": "unwatch", "session_id": session_id}, "unwatched")
        assert unwatched["session_id"] == session_id
        stale = await watcher.call(
            {"t": "watch", "session_id": session_id, "after_cursor": "bm90LWEtY3Vyc29y"},
            "watch_error",
        )
        assert stale == {"t": "watch_error", "id": stale["id"], "code": "resync_required"}
    finally:
        if watcher is not None:
            await watcher.close()
        await shim.close_stdin()
        await shim.wait()


async def test_control_is_handed_over_on_request_and_by_timeout(home: Path, project: Path) -> None:
    first = await _peer(home, project, "first")
    second = await _peer(home, project, "second")
    watcher = await _peer(home, project, "watcher")
    try:
        opened = await first.request("session.create", {})
        session_id = opened["payload"]["session_id"]
        await watcher.call({"t": "watch", "session_id": session_id}, "watch_result")

        # Asked and granted by the controller.
        await second.channel.send({"t": "control_request", "id": 7, "session_id": session_id})
        asked = await first.until(_is("control_requested", session_id=session_id))
        assert asked["by"].startswith("second#")
        assert (await watcher.until(_is("watch_event", event="control_requested")))["by"] == asked[
            "by"
        ]
        answered = await first.call(
            {"t": "control_answer", "session_id": session_id, "grant": True}, "control_answered"
        )
        assert answered["t"] == "control_answered"
        granted = await second.until(lambda f: f.get("id") == 7)
        assert granted["t"] == "control_granted", granted
        changed = await first.until(_is("control_changed", session_id=session_id))
        assert changed["controller"].startswith("second#")
        watched = await watcher.until(_is("watch_event", event="control_changed"))
        assert watched["controller"].startswith("second#")

        # The old controller is refused a turn on it now.
        refused = await first.request("turn.start", {"prompt": "x"}, session_id=session_id)
        assert refused["error"]["code"] == "session_busy"

        # Refused by the controller.
        await first.channel.send({"t": "control_request", "id": 8, "session_id": session_id})
        await second.until(_is("control_requested", session_id=session_id))
        await second.call(
            {"t": "control_answer", "session_id": session_id, "grant": False}, "control_answered"
        )
        assert await first.until(lambda f: f.get("id") == 8) == {
            "t": "grant_error",
            "id": 8,
            "code": "control_refused",
        }

        # Unanswered: granted once the request's timeout (1 s here) passed.
        await first.channel.send({"t": "control_request", "id": 9, "session_id": session_id})
        await second.until(_is("control_requested", session_id=session_id))
        granted = await first.until(lambda f: f.get("id") == 9, timeout=30)
        assert granted["t"] == "control_granted", granted
        await second.until(_is("control_changed", session_id=session_id))

        # Released: anyone may take it at once.
        released = await first.call(
            {"t": "control_release", "session_id": session_id}, "control_released"
        )
        assert released["t"] == "control_released"
        taken = await second.call(
            {"t": "take_control", "session_id": session_id}, "control_granted"
        )
        assert taken["t"] == "control_granted", taken
    finally:
        for peer in (first, second, watcher):
            await peer.close()
