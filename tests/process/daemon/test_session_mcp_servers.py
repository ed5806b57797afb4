"""A session's own MCP servers and its transcript through the client library against a
real daemon (RFC-0002 §6.13, §6.14): servers given with ``session.create`` are used by a
turn any client starts on that session — here a v1 frontend's, through the shim — and the
session's transcript shows that turn's tool call where it happened; bad definitions are
``request_error`` ``invalid_mcp_servers`` without running."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from magi_code.client import Client, DaemonError
from tests.process.daemon.support import context
from tests.process.turn_support import (
    body_text,
    posted_bodies,
    run_turn,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import running_service

INITIALIZE = {"supported_protocol_versions": [1]}
MCP_SERVER = Path(__file__).parents[2] / "unit" / "tools" / "mcp_echo_server.py"


async def test_a_v1_frontends_turn_uses_the_sessions_own_servers(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        write_settings(home, fake)
        fake.enqueue(
            tool_reply(tool_call("m1", "mcp__ed__echo", text="via-v1", env_name="ED_MARK")),
            Reply(text=["ok"]),
        )
        server = {"name": "ed", "command": sys.executable, "args": [str(MCP_SERVER)]}
        async with await Client.connect(context(home, project)) as client:
            assert {"session.mcp_servers", "session.transcript"} <= set(
                client.welcome["capabilities"]
            )
            assert (await client.request("initialize", INITIALIZE))["error"] is None
            too_many = [{**server, "name": f"s{i}"} for i in range(17)]
            with pytest.raises(DaemonError) as refused:
                await client.request("session.create", {}, mcp_servers=too_many)
            assert refused.value.code == "invalid_mcp_servers"
            created = await client.request(
                "session.create", {}, mcp_servers=[{**server, "env": {"ED_MARK": "m-3"}}]
            )
            session_id = created["payload"]["session_id"]
            await client.request("session.close", {}, session_id=session_id)

            # (The v1 service's end stops the daemon: everything is asked inside.)
            async with running_service(home, project) as v1:
                _, turn = await run_turn(v1, "go", session_id=session_id)
                assert turn.terminal["status"] == "completed"
                assert "via-v1|ED_MARK=m-3" in body_text(posted_bodies(fake)[1])

                page = await client.transcript(session_id)
                assert page["next_cursor"] is None
                kinds = [(i["kind"], i.get("role")) for i in page["items"]]
                assert kinds == [
                    ("message", "user"),
                    ("tool_call", None),
                    ("message", "assistant"),
                    ("terminal", None),
                ]
                call = page["items"][1]
                assert call["status"] == "completed"
                assert call["call"]["tool"] == "mcp__ed__echo"
                assert call["call"]["arguments"] == {"text": "via-v1", "env_name": "ED_MARK"}
