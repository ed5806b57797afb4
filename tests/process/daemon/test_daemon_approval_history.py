"""Approvals in a session's durable history, through real daemons: the v2 watch history
shows each approval where it was asked (kind ``approval``: its ID, kind, bounded subject,
decision and who answered; its JSON Schema holds), also after the daemon restarted; one
whose daemon died while it waited shows as ``pending``; the v1 ``session.replay`` never
shows one."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from magi_code.client import connect_channel
from tests.process.daemon.support import context, replay_in_new_shim, status, wait_for
from tests.process.turn_support import tool_call, tool_reply, write_settings
from tests.support import wire_schema
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import stop_daemon
from tests.support.v2peer import Frame, Peer

V1_KINDS = {"message", "terminal", "summary"}


async def _peer(home: Path, project: Path, name: str) -> Peer:
    channel = await connect_channel(
        context(home, project),
        "persistent",
        autostart=True,
        client_name=name,
        options={"approvals": True},
    )
    return await Peer.over(channel)


async def _asked_turn(
    peer: Peer, fake: FakeProviderServer, command: str, session_id: str | None, *, ends: bool
) -> tuple[str, str, Frame]:
    """Start a turn whose model runs ``command``: (turn, session, its approval request)."""
    fake.enqueue(tool_reply(tool_call("s1", "shell", command=command)))
    if ends:
        fake.enqueue(Reply(text=["done"]))
    extra = {} if session_id is None else {"session_id": session_id}
    response = await peer.request("turn.start", {"prompt": f"run {command}"}, **extra)
    assert response["error"] is None, response
    turn_id, session_id = response["payload"]["turn_id"], response["payload"]["session_id"]
    request = await peer.until(lambda f: f["t"] == "approval_request")
    return turn_id, session_id, request


async def _answered_turn(
    peer: Peer, fake: FakeProviderServer, command: str, session_id: str | None, decision: str
) -> tuple[str, str, Frame]:
    turn_id, session_id, request = await _asked_turn(peer, fake, command, session_id, ends=True)
    answer = {"t": "approval_answer", "approval_id": request["approval_id"], "decision": decision}
    await peer.channel.send({**answer, "id": 1})
    await peer.until(lambda f: f["t"] == "approval_resolved")
    events = await peer.turn_events(turn_id)
    assert events[-1]["payload"]["status"] == "completed"
    return turn_id, session_id, request


async def _history(home: Path, project: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's watch history, read by a new persistent connection."""
    watcher = await _peer(home, project, "watcher")
    try:
        answer = await watcher.call({"t": "watch", "session_id": session_id}, "watch_result")
        assert answer["t"] == "watch_result", answer
        assert answer["more"] is False
        items: list[dict[str, Any]] = answer["events"]
        return items
    finally:
        await watcher.close()


def _shape(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (i["kind"], i.get("decision")) if i["kind"] == "approval" else (i["kind"], i.get("role"))
        for i in items
    ]


async def test_watch_history_shows_each_approval_where_it_happened_and_v1_replay_does_not(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    peer = await _peer(home, project, "asker")
    try:
        first, session_id, allowed = await _answered_turn(
            peer, fake, "touch a.txt", None, "allow_once"
        )
        second, _, rejected = await _answered_turn(peer, fake, "rm -f b.txt", session_id, "reject")
    finally:
        await peer.close()

    for restarted in (False, True):
        if restarted:
            stop_daemon(home)  # the next watch is answered by a new daemon, from the journal
        items = await _history(home, project, session_id)
        assert _shape(items) == [
            ("message", "user"),
            ("approval", "allow_once"),
            ("message", "assistant"),
            ("terminal", None),
            ("message", "user"),
            ("approval", "reject"),
            ("message", "assistant"),
            ("terminal", None),
        ]
        approvals = [i for i in items if i["kind"] == "approval"]
        for item, request, turn_id, command in (
            (approvals[0], allowed, first, "touch a.txt"),
            (approvals[1], rejected, second, "rm -f b.txt"),
        ):
            assert item["approval_id"] == request["approval_id"]
            assert item["turn_id"] == turn_id
            assert item["approval_kind"] == "command"
            assert item["subject"] == command
            assert item["by"].startswith("asker#")
            wire_schema.check("v2.history.approval", item)
        # Watching from an approval item's cursor goes on right after it.
        after = items.index(approvals[0])
        watcher = await _peer(home, project, "resumer")
        try:
            cursor = items[after]["cursor"]
            resumed = await watcher.call(
                {"t": "watch", "session_id": session_id, "after_cursor": cursor}, "watch_result"
            )
            assert resumed["t"] == "watch_result", resumed
            assert resumed["events"] == items[after + 1 :]
        finally:
            await watcher.close()

    replayed = await replay_in_new_shim(home, project, session_id)
    assert {i["kind"] for i in replayed} == {"message", "terminal"}
    assert [(i["kind"], i.get("role")) for i in replayed] == [
        s for s in _shape(items) if s[0] != "approval"
    ]


async def test_an_approval_whose_daemon_died_while_it_waited_shows_pending(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    peer = await _peer(home, project, "asker")
    try:
        turn_id, session_id, request = await _asked_turn(
            peer, fake, "touch c.txt", None, ends=False
        )
        os.kill(status(home)["pid"], signal.SIGKILL)
        await wait_for(lambda: not status(home)["running"], 30, "the daemon to die")
    finally:
        await peer.close()
    peer = await _peer(home, project, "back")  # a new daemon
    try:
        # Opening the session records the dead turn's end (service_interrupted).
        opened = await peer.request("session.open", {}, session_id=session_id)
        assert opened["error"] is None, opened
        items = await _history(home, project, session_id)
    finally:
        await peer.close()
    assert _shape(items) == [("message", "user"), ("approval", "pending"), ("terminal", None)]
    approval = items[1]
    assert approval["approval_id"] == request["approval_id"]
    assert approval["turn_id"] == turn_id
    assert approval["by"] is None
    wire_schema.check("v2.history.approval", approval)
    assert items[2]["status"] == "failed"
    replayed = await replay_in_new_shim(home, project, session_id)
    assert {i["kind"] for i in replayed} <= V1_KINDS
    assert [i["kind"] for i in replayed] == ["message", "terminal"]
