"""Permissions and session modes of ``magi-code --app acp`` with the official ACP SDK as
the editor, in both service modes: under ``ask`` a command becomes
``session/request_permission`` on its tool call; "allow once" runs it, "allow always" runs
it and the same command runs unasked next time, "reject" and "always reject" refuse it
(the latter without asking again); cancelling the prompt while asked (the editor answers
the cancelled outcome) stops the turn; the session modes are the approval policies and
``read_only`` refuses a write unasked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from acp.client.connection import ClientSideConnection
from acp.exceptions import RequestError

from tests.process.acp_support import Editor, acp_agent, text_prompt
from tests.process.turn_support import (
    body_text,
    posted_bodies,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply

# The adapter runs the core in-process in embedded mode: both modes are its behaviour.
pytestmark = pytest.mark.both_modes

KINDS = ["allow_once", "allow_always", "reject_once", "reject_always"]


async def _run(
    conn: ClientSideConnection,
    editor: Editor,
    fake: FakeProviderServer,
    session_id: str,
    command: str,
) -> tuple[str, int]:
    """A prompt whose model runs ``command``: its stop reason and how many permission
    requests it made."""
    fake.enqueue(tool_reply(tool_call("s1", "shell", command=command)), Reply(text=["ok"]))
    before = len(editor.permissions)
    answer = await conn.prompt(session_id=session_id, prompt=text_prompt("go"))
    return answer.stop_reason, len(editor.permissions) - before


def _tool_result(fake: FakeProviderServer) -> str:
    return body_text(posted_bodies(fake)[-1])


async def test_permission_round_trip_and_modes(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        created = await conn.new_session(cwd=str(project), mcp_servers=[])
        session_id = created.session_id
        assert created.modes is not None and created.modes.current_mode_id == "ask"
        assert [m.id for m in created.modes.available_modes] == ["ask", "auto", "read_only"]

        # Allow once: it runs; the request is about its tool call.
        editor.replies.put_nowait("allow_once")
        assert await _run(conn, editor, fake, session_id, "touch once.txt") == ("end_turn", 1)
        assert (project / "once.txt").exists()
        asked = editor.permissions[-1]
        assert [o["kind"] for o in asked["options"]] == KINDS
        assert [o["optionId"] for o in asked["options"]] == KINDS
        always = asked["options"][1]["name"]
        assert always == "Always allow in this session"  # the project is not trusted
        assert asked["toolCall"]["kind"] == "execute"
        assert asked["toolCall"]["rawInput"]["argv"] == ["touch", "once.txt"]
        calls = [u["toolCallId"] for u in editor.updates if u["sessionUpdate"] == "tool_call"]
        assert asked["toolCall"]["toolCallId"] in calls

        # Allow always: it runs, and the same command runs unasked next time.
        editor.replies.put_nowait("allow_always")
        assert await _run(conn, editor, fake, session_id, "touch always.txt") == ("end_turn", 1)
        (project / "always.txt").unlink()
        assert await _run(conn, editor, fake, session_id, "touch always.txt") == ("end_turn", 0)
        assert (project / "always.txt").exists()

        # Reject: refused, the turn goes on.
        editor.replies.put_nowait("reject_once")
        assert await _run(conn, editor, fake, session_id, "touch no.txt") == ("end_turn", 1)
        assert not (project / "no.txt").exists()
        assert "rejected by the user" in _tool_result(fake)
        # Always reject: refused, and refused unasked next time.
        editor.replies.put_nowait("reject_always")
        assert await _run(conn, editor, fake, session_id, "touch never.txt") == ("end_turn", 1)
        assert await _run(conn, editor, fake, session_id, "touch never.txt") == ("end_turn", 0)
        assert not (project / "never.txt").exists()
        assert "rejected by the user" in _tool_result(fake)

        # Read-only mode: a write is refused without asking.
        await conn.set_session_mode(session_id=session_id, mode_id="read_only")
        assert await _run(conn, editor, fake, session_id, "touch ro.txt") == ("end_turn", 0)
        assert not (project / "ro.txt").exists()
        assert "refused: the approval policy is read_only" in _tool_result(fake)
        # Auto mode: runs unasked.
        await conn.set_session_mode(session_id=session_id, mode_id="auto")
        assert await _run(conn, editor, fake, session_id, "touch auto.txt") == ("end_turn", 0)
        assert (project / "auto.txt").exists()
        with pytest.raises(RequestError) as bad:
            await conn.set_session_mode(session_id=session_id, mode_id="yolo")
        assert bad.value.code == -32602


async def test_cancelling_a_prompt_while_asked_stops_the_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    fake.enqueue(tool_reply(tool_call("s1", "shell", command="touch x.txt")), Reply(text=["ok"]))
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=text_prompt("go")))
        async with asyncio.timeout(60):
            while not editor.permissions:
                editor.changed.clear()
                await editor.changed.wait()
        # ACP: the client cancels, then answers its pending permission requests cancelled.
        await conn.cancel(session_id=session_id)
        editor.replies.put_nowait(None)
        answer = await asyncio.wait_for(prompt, 60)
        assert answer.stop_reason == "cancelled"
        assert not (project / "x.txt").exists()


async def test_an_untrusted_project_that_asks_keeps_asking_in_auto_mode(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)  # auto
    (project / ".magi-code").mkdir()
    (project / ".magi-code" / "settings.json").write_text('{"approval_policy": "ask"}')
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        created = await conn.new_session(cwd=str(project), mcp_servers=[])
        assert created.modes is not None and created.modes.current_mode_id == "ask"
        await conn.set_session_mode(session_id=created.session_id, mode_id="auto")
        shown = await editor.wait_for(lambda u: u["sessionUpdate"] == "current_mode_update")
        assert shown["currentModeId"] == "ask"
        editor.replies.put_nowait("allow_once")
        assert await _run(conn, editor, fake, created.session_id, "touch y.txt") == (
            "end_turn",
            1,
        )
