"""Approvals through the daemon (v2 ``persistent`` connections that negotiated them),
with the loopback fake provider asking for real shell commands: a command waits for an
answer; a frontend attaching mid-wait gets the pending request and answers it, the first
sees ``approval_resolved`` and a later answer ``approval_already_resolved``; a frontend
whose process was killed gets the request again when it reconnects and takes control;
the deadline rejects; "allow always for this project" persists a rule the next turn
honours; cancelling the turn settles its request; grants can be listed and revoked."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from magi_code.client import connect_channel
from tests.process.daemon.support import context
from tests.process.turn_support import (
    body_text,
    posted_bodies,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import service_env
from tests.support.v2peer import Frame, Peer

COMMAND = "touch approved.txt"


async def _peer(home: Path, project: Path, name: str, *, approvals: bool = True) -> Peer:
    channel = await connect_channel(
        context(home, project),
        "persistent",
        autostart=True,
        client_name=name,
        options={"approvals": approvals},
    )
    return await Peer.over(channel)


def _is(kind: str, approval_id: str | None = None) -> Any:
    return lambda f: f["t"] == kind and (approval_id is None or f["approval_id"] == approval_id)


async def _start(
    peer: Peer, fake: FakeProviderServer, *, ends: bool = True, **settings: Any
) -> tuple[str, str]:
    """Start a turn whose model asks for :data:`COMMAND` (and then, if ``ends``, answers)."""
    fake.enqueue(tool_reply(tool_call("s1", "shell", command=COMMAND)))
    if ends:
        fake.enqueue(Reply(text=["done"]))
    response = await peer.request("turn.start", {"prompt": "make the file"}, **settings)
    assert response["error"] is None, response
    return response["payload"]["turn_id"], response["payload"]["session_id"]


async def _terminal(peer: Peer, turn_id: str) -> Frame:
    events = await peer.turn_events(turn_id)
    payload: Frame = events[-1]["payload"]
    return payload


async def test_a_second_frontend_gets_the_pending_request_and_its_answer_wins(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    first = await _peer(home, project, "first")
    second = await _peer(home, project, "second")
    try:
        turn_id, session_id = await _start(first, fake)
        request = await first.until(_is("approval_request"))
        assert request["turn_id"] == turn_id and request["session_id"] == session_id
        assert request["kind"] == "command"
        assert request["summary"]["argv"] == ["touch", "approved.txt"]
        assert "allow_project" not in request["options"]  # the project is not trusted
        assert not (project / "approved.txt").exists()  # the command waits
        # The second frontend attaches mid-wait and gets the same request.
        answer, _ = await second.attach(turn_id)
        assert answer["status"] == "attached"
        again = await second.until(_is("approval_request", request["approval_id"]))
        assert again == request
        await second.channel.send(
            {
                "t": "approval_answer",
                "id": 7,
                "approval_id": request["approval_id"],
                "decision": "allow_once",
            }
        )
        for peer in (first, second):
            resolved = await peer.until(_is("approval_resolved", request["approval_id"]))
            assert resolved["decision"] == "allow_once"
            assert resolved["by"].startswith("second#")
        late = await first.call(
            {"t": "approval_answer", "approval_id": request["approval_id"], "decision": "reject"},
            "approval_already_resolved",
        )
        assert late["t"] == "approval_already_resolved" and late["decision"] == "allow_once"
        terminal = await _terminal(first, turn_id)
        assert terminal["status"] == "completed"
        assert (project / "approved.txt").exists()
    finally:
        await first.close()
        await second.close()


async def test_a_frontend_without_approvals_gets_the_fixed_refusal(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    peer = await _peer(home, project, "plain", approvals=False)
    try:
        turn_id, _ = await _start(peer, fake)
        assert (await _terminal(peer, turn_id))["status"] == "completed"
    finally:
        await peer.close()
    assert not (project / "approved.txt").exists()
    assert "needs approval: this frontend cannot approve" in body_text(posted_bodies(fake)[1])


async def test_the_deadline_rejects_with_the_fixed_reason(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask", approval_timeout_seconds=1)
    peer = await _peer(home, project, "slow")
    try:
        turn_id, _ = await _start(peer, fake)
        request = await peer.until(_is("approval_request"))
        resolved = await peer.until(_is("approval_resolved", request["approval_id"]))
        assert resolved["decision"] == "timed_out" and resolved["by"] == "deadline"
        assert (await _terminal(peer, turn_id))["status"] == "completed"
    finally:
        await peer.close()
    assert not (project / "approved.txt").exists()
    result = body_text(posted_bodies(fake)[1])
    assert "rejected: no answer before the approval deadline" in result


async def test_allow_always_persists_a_rule_the_next_turn_honours_and_grants_revoke_it(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask", trusted_projects=[str(project)])
    peer = await _peer(home, project, "only")
    try:
        turn_id, session_id = await _start(peer, fake)
        request = await peer.until(_is("approval_request"))
        assert "allow_project" in request["options"]
        await peer.channel.send(
            {
                "t": "approval_answer",
                "id": 1,
                "approval_id": request["approval_id"],
                "decision": "allow_project",
            }
        )
        assert (await _terminal(peer, turn_id))["status"] == "completed"
        saved = json.loads((project / ".magi-code" / "settings.json").read_text())
        assert saved["approval_rules"]["allow"]["commands"] == [["touch", "approved.txt"]]
        (project / "approved.txt").unlink()
        # The next turn runs the same command without asking.
        turn_id, _ = await _start(peer, fake, session_id=session_id)
        assert (await _terminal(peer, turn_id))["status"] == "completed"
        assert (project / "approved.txt").exists()
        assert not [f for f in peer.seen if f["t"] == "approval_request"]
        grants = await peer.call({"t": "grants_list", "session_id": session_id}, "grants_result")
        assert grants["project"]["commands"] == [["touch", "approved.txt"]]
        assert grants["project_honoured"] is True
        revoked = await peer.call(
            {
                "t": "grants_revoke",
                "scope": "project",
                "kind": "commands",
                "value": ["touch", "approved.txt"],
            },
            "grants_result",
        )
        assert revoked["project"]["commands"] == []
    finally:
        await peer.close()


async def test_allow_for_the_session_is_a_session_grant(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    peer = await _peer(home, project, "only")
    try:
        turn_id, session_id = await _start(peer, fake)
        request = await peer.until(_is("approval_request"))
        await peer.channel.send(
            {
                "t": "approval_answer",
                "id": 1,
                "approval_id": request["approval_id"],
                "decision": "allow_session",
            }
        )
        assert (await _terminal(peer, turn_id))["status"] == "completed"
        grants = await peer.call({"t": "grants_list", "session_id": session_id}, "grants_result")
        assert grants["session"]["commands"] == [["touch", "approved.txt"]]
        revoked = await peer.call(
            {
                "t": "grants_revoke",
                "scope": "session",
                "session_id": session_id,
                "kind": "commands",
                "value": ["touch", "approved.txt"],
            },
            "grants_result",
        )
        assert revoked["session"]["commands"] == []
    finally:
        await peer.close()


async def test_cancelling_the_turn_settles_its_request_and_reject_and_stop_stops_it(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    peer = await _peer(home, project, "only")
    try:
        turn_id, session_id = await _start(peer, fake, ends=False)
        request = await peer.until(_is("approval_request"))
        await peer.request("turn.cancel", {"turn_id": turn_id})
        resolved = await peer.until(_is("approval_resolved", request["approval_id"]))
        assert resolved["decision"] == "cancelled"
        assert (await _terminal(peer, turn_id))["status"] == "cancelled"
        turn_id, _ = await _start(peer, fake, ends=False, session_id=session_id)
        request = await peer.until(_is("approval_request"))
        await peer.channel.send(
            {
                "t": "approval_answer",
                "id": 2,
                "approval_id": request["approval_id"],
                "decision": "reject_and_stop",
            }
        )
        assert (await _terminal(peer, turn_id))["status"] == "cancelled"
    finally:
        await peer.close()
    assert not (project / "approved.txt").exists()


CLIENT = """\
import asyncio, sys
from pathlib import Path
from magi_code.client import connect_channel
from magi_code.protocol import envelope
from magi_code.storage.launch import LaunchContext
import os

async def main():
    ctx = LaunchContext(Path(sys.argv[1]), Path(sys.argv[2]), dict(os.environ))
    channel = await connect_channel(ctx, "persistent", autostart=True, client_name="doomed",
                                    options={"approvals": True})
    await channel.send({"t": "request", "message": envelope.request(
        "i", "initialize", {"supported_protocol_versions": [1]})})
    await channel.send({"t": "request", "message": envelope.request(
        "s", "turn.start", {"prompt": "make the file"})})
    while (frame := await channel.recv()) is not None:
        if frame["t"] == "approval_request":
            print(frame["approval_id"], frame["session_id"], frame["turn_id"], flush=True)
            await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_frontend_killed_while_asked_gets_the_request_again_on_reconnect(
    home: Path, project: Path, fake: FakeProviderServer, tmp_path: Path
) -> None:
    write_settings(home, fake, approval_policy="ask")
    fake.enqueue(tool_reply(tool_call("s1", "shell", command=COMMAND)), Reply(text=["done"]))
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(home), str(project)],
        env=service_env(home),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        approval_id, session_id, turn_id = line.split()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    peer = await _peer(home, project, "back")
    try:
        granted = await peer.call(
            {"t": "take_control", "session_id": session_id}, "control_granted"
        )
        assert granted["t"] == "control_granted", granted
        request = await peer.until(_is("approval_request", approval_id))
        assert request["turn_id"] == turn_id
        answer, _ = await peer.attach(turn_id)
        assert answer["status"] == "attached"
        await peer.channel.send(
            {"t": "approval_answer", "id": 3, "approval_id": approval_id, "decision": "allow_once"}
        )
        resolved = await peer.until(_is("approval_resolved", approval_id))
        assert resolved["by"].startswith("back#")
        assert (await _terminal(peer, turn_id))["status"] == "completed"
    finally:
        await peer.close()
    assert (project / "approved.txt").exists()
