"""Approvals through the client library (``magi_code.client``) against a real daemon: a
client that asked for approvals gets the request as a typed event and answers it with
``answer_approval``; a session grant is listed and revoked with ``grants_list`` /
``grants_revoke``; a refused answer and a bad revoke raise the typed errors. The sync
client answers the same way. A session's own policy (``set_session_policy``) rules its
calls, never looser than an untrusted project asks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magi_code.client import (
    ApprovalError,
    ApprovalRequest,
    ApprovalResolved,
    Client,
    EventEnvelope,
    GrantsError,
    SyncClient,
)
from tests.process.daemon.support import answered_turn, context
from tests.process.turn_support import (
    body_text,
    posted_bodies,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply

INITIALIZE = {"supported_protocol_versions": [1]}


def _enqueue(fake: FakeProviderServer, command: str) -> None:
    fake.enqueue(tool_reply(tool_call("s1", "shell", command=command)))
    fake.enqueue(Reply(text=["done"]))


async def _next(client: Client, kind: type) -> object:
    """The next event of that type (v1 events before it are skipped)."""
    async with asyncio.timeout(30):
        while True:
            event = await client.next_event()
            assert event is not None, "the connection ended"
            if isinstance(event, kind):
                return event


async def _terminal(client: Client, turn_id: str) -> list[EventEnvelope]:
    """The turn's v1 events up to its terminal (the last)."""
    events: list[EventEnvelope] = []
    async with asyncio.timeout(30):
        while not events or events[-1]["event"] != "turn.terminal":
            event = await client.next_event()
            assert event is not None, "the connection ended"
            if isinstance(event, dict) and event["payload"].get("turn_id") == turn_id:
                events.append(event)
    return events


async def test_a_command_under_ask_is_answered_through_the_client(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    async with await Client.connect(context(home, project), approvals=True) as client:
        assert (await client.request("initialize", INITIALIZE))["error"] is None
        _enqueue(fake, "touch approved.txt")
        started = await client.request("turn.start", {"prompt": "make the file"})
        assert started["payload"] is not None
        turn_id, session_id = started["payload"]["turn_id"], started["payload"]["session_id"]

        request = await _next(client, ApprovalRequest)
        assert isinstance(request, ApprovalRequest)
        assert (request.turn_id, request.session_id) == (turn_id, session_id)
        assert request.kind == "command"
        assert request.summary["argv"] == ["touch", "approved.txt"]
        assert "allow_session" in request.options
        assert not (project / "approved.txt").exists()  # it waits for the answer

        with pytest.raises(ApprovalError) as refused:
            await client.answer_approval("appr_unknown", "allow_once")
        assert refused.value.code == "unknown_approval"

        resolved = await client.answer_approval(request.approval_id, "allow_session")
        assert resolved.approval_id == request.approval_id
        assert resolved.decision == "allow_session"
        assert resolved.by.startswith("magi_code.client#")
        event = await _next(client, ApprovalResolved)
        assert event == resolved
        events = await _terminal(client, turn_id)
        assert events[-1]["payload"]["status"] == "completed"
        assert (project / "approved.txt").exists()
        # The request names the tool call's activity.
        tools = [
            e["payload"]["activity"]
            for e in events
            if e["event"] == "turn.activity" and e["payload"]["activity"]["kind"] == "tool"
        ]
        shell = [a["activity_id"] for a in tools if a.get("tool_name") == "shell"]
        assert shell and set(shell) == {request.activity_id}

        # A second answer is told how it was settled.
        again = await client.answer_approval(request.approval_id, "reject")
        assert (again.decision, again.by) == ("allow_session", resolved.by)

        grants = await client.grants_list(session_id)
        assert grants["session"] is not None
        assert grants["session"]["commands"] == [["touch", "approved.txt"]]
        assert grants["project_honoured"] is False
        after = await client.grants_revoke(
            "session", "commands", ["touch", "approved.txt"], session_id=session_id
        )
        assert after["session"] is not None and after["session"]["commands"] == []
        with pytest.raises(GrantsError) as bad:
            await client.grants_revoke("session", "commands", ["touch"])  # no session named
        assert bad.value.code == "invalid_request"


def test_the_sync_client_answers_a_request(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    with SyncClient.connect(context(home, project), approvals=True, timeout=30) as client:
        client.request("initialize", INITIALIZE, timeout=30)
        _enqueue(fake, "touch rejected.txt")
        started = client.request("turn.start", {"prompt": "make the file"}, timeout=30)
        assert started["payload"] is not None
        turn_id = started["payload"]["turn_id"]
        request = next(e for e in client.events(30) if isinstance(e, ApprovalRequest))
        resolved = client.answer_approval(request.approval_id, "reject", timeout=30)
        assert resolved.decision == "reject"
        terminal = next(
            e
            for e in client.events(30)
            if isinstance(e, dict)
            and e["event"] == "turn.terminal"
            and e["payload"]["turn_id"] == turn_id
        )
        assert terminal["payload"]["status"] == "completed"
        assert not (project / "rejected.txt").exists()


async def _run(client: Client, fake: FakeProviderServer, session_id: str, command: str) -> bool:
    """Run a turn whose model runs ``command``; whether it was asked (then allowed once)."""
    _enqueue(fake, command)
    _, asked = await answered_turn(client, "allow_once", session_id)
    return asked is not None


async def test_a_session_chooses_its_own_policy_within_what_the_project_allows(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    async with await Client.connect(context(home, project), approvals=True) as client:
        await client.request("initialize", INITIALIZE)
        created = await client.request("session.create", {})
        assert created["payload"] is not None
        session_id = created["payload"]["session_id"]

        assert await client.set_session_policy(session_id, "auto") == "auto"
        assert not await _run(client, fake, session_id, "touch auto.txt")
        assert (project / "auto.txt").exists()

        await client.set_session_policy(session_id, "read_only")
        assert not await _run(client, fake, session_id, "touch read-only.txt")
        assert not (project / "read-only.txt").exists()
        assert "refused: the approval policy is read_only" in body_text(posted_bodies(fake)[-1])

        # The settings' policy again.
        assert await client.set_session_policy(session_id, None) == "ask"
        assert await _run(client, fake, session_id, "touch asked.txt")
        assert (project / "asked.txt").exists()

        with pytest.raises(ApprovalError) as bad:
            await client.set_session_policy(session_id, "yolo")
        assert bad.value.code == "invalid_request"

        # An untrusted project's file tightened to ask: a session's auto does not loosen it.
        (project / ".magi-code").mkdir()
        (project / ".magi-code" / "settings.json").write_text('{"approval_policy": "ask"}')
        write_settings(home, fake, approval_policy="auto")
        assert await client.set_session_policy(session_id, "auto") == "ask"
        assert await _run(client, fake, session_id, "touch floored.txt")
