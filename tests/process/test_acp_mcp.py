"""The editor's MCP servers (``mcpServers`` of ``session/new`` and ``session/load``) in
``magi-code --app acp``, with the official ACP SDK as the editor, in both service modes:
a client stdio server joins the configured ones for that session's turns (the model calls
its tool and sees the result), a configured server keeps its name against a client one,
the client's environment reaches the server but is written nowhere, and bad or too many
definitions are ``-32602``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from acp import schema
from acp.exceptions import RequestError

from tests.process.acp_support import acp_agent, text_prompt, tool_calls
from tests.process.turn_support import body_text, posted_bodies, tool_call, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply

pytestmark = pytest.mark.both_modes

MCP_SERVER = Path(__file__).parents[1] / "unit" / "tools" / "mcp_echo_server.py"
SECRET = "editor-secret-7f3a9c"


def _stdio(name: str, **env: str) -> schema.McpServerStdio:
    return schema.McpServerStdio(
        name=name,
        command=sys.executable,
        args=[str(MCP_SERVER)],
        env=[schema.EnvVariable(name=k, value=v) for k, v in env.items()],
    )


def _echo_calls(*calls: tuple[str, str, str]) -> Reply:
    return Reply(
        text=[],
        tool_calls=tuple(
            tool_call(cid, f"mcp__{server}__echo", text=f"from-{server}", env_name=variable)
            for cid, server, variable in calls
        ),
    )


def _files_holding(root: Path, needle: str) -> list[Path]:
    return [
        path
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes()
    ]


async def test_a_client_stdio_server_joins_the_configured_ones_for_the_session(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    configured = {"conf": {"command": sys.executable, "args": [str(MCP_SERVER)]}}
    write_settings(home, fake, mcp_servers=configured)
    fake.enqueue(
        # The editor's server (named with a space: sent as editor_tools), and "conf", which
        # both the settings and the editor name: the configured one answers.
        _echo_calls(("m1", "editor_tools", "EDITOR_MARK"), ("m2", "conf", "EDITOR_MARK")),
        Reply(text=["done"]),
    )
    servers: list[Any] = [
        _stdio("editor tools", EDITOR_MARK="mark-1", EDITOR_TOKEN=SECRET),
        _stdio("conf", EDITOR_MARK="client-conf"),
        # Not offered in initialize: left out, not an error.
        schema.HttpMcpServer(
            type="http", name="remote", url="https://example.invalid/mcp", headers=[]
        ),
    ]
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=servers)).session_id
        answer = await conn.prompt(session_id=session_id, prompt=text_prompt("use the tools"))
        assert answer.stop_reason == "end_turn"
        calls = list(tool_calls(editor.updates).values())
        assert [(c["kind"], c["status"]) for c in calls] == [("other", "completed")] * 2

        # The results reached the model: the editor's server with the editor's env.
        results = body_text(posted_bodies(fake)[1])
        assert "from-editor_tools|EDITOR_MARK=mark-1" in results
        assert "from-conf|EDITOR_MARK=<unset>" in results
        # Both tools were offered to the model, under their server names.
        offered = body_text(posted_bodies(fake)[0])
        assert "mcp__editor_tools__echo" in offered and "mcp__conf__echo" in offered

        # A session of its own has only the configured servers.
        other = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        fake.enqueue(_echo_calls(("m3", "editor_tools", "EDITOR_MARK")), Reply(text=["none"]))
        await conn.prompt(session_id=other, prompt=text_prompt("again"))
        assert "mcp__editor_tools__echo" not in body_text(posted_bodies(fake)[2])

        # Too many servers, or a variable name a process environment cannot have: -32602,
        # and the error does not repeat what was sent.
        for bad in ([_stdio(f"s{i}") for i in range(17)], [_stdio("x", **{"1BAD": SECRET})]):
            with pytest.raises(RequestError) as refused:
                await conn.new_session(cwd=str(project), mcp_servers=bad)
            assert refused.value.code == -32602
            assert SECRET not in str(refused.value) and SECRET not in repr(refused.value.data)
    # The client's environment lives in memory only: no file of the home holds it.
    assert _files_holding(home, SECRET) == []


async def test_load_gives_the_session_the_servers_it_names(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    async with acp_agent(home, project) as (conn, _editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
    fake.enqueue(_echo_calls(("m1", "loaded", "LOAD_MARK")), Reply(text=["ok"]))
    async with acp_agent(home, project) as (conn, _editor):
        await conn.initialize(protocol_version=1)
        servers: list[Any] = [_stdio("loaded", LOAD_MARK="mark-2")]
        await conn.load_session(cwd=str(project), session_id=session_id, mcp_servers=servers)
        await conn.prompt(session_id=session_id, prompt=text_prompt("use it"))
        assert "from-loaded|LOAD_MARK=mark-2" in body_text(posted_bodies(fake)[1])
