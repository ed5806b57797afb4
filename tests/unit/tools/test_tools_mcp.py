"""MCP servers through McpToolset with a real stdio server built on the ``mcp`` SDK
(issue: MCP servers configured in settings, failures isolated to that tool call).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest
from mcp import types

from magi_code.tools.base import Tool, ToolContext, ToolOutcome, run_tool
from magi_code.tools.mcp import McpServerSpec, McpTool, McpToolset, mcp_tool_name, result_text

SERVER_SCRIPT = str(Path(__file__).with_name("mcp_echo_server.py").resolve())


def spec(
    name: str,
    command: str = sys.executable,
    args: tuple[str, ...] = (SERVER_SCRIPT,),
    env: Mapping[str, str] | None = None,
) -> McpServerSpec:
    return McpServerSpec(name, command, args, env or {})


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(
        project_dir=tmp_path,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MC_DAEMON_SOCKET": "/run/mc/daemon.sock",
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "CUSTOM_KEY": "custom-secret",
        },
        secret_names=frozenset({"CUSTOM_KEY"}),
    )


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


async def call(tool: Tool, ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(tool, json.dumps(arguments), ctx)


def live(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def our_servers() -> list[int]:
    pids = []
    for child in psutil.Process().children(recursive=True):
        try:
            if SERVER_SCRIPT in child.cmdline():
                pids.append(child.pid)
        except psutil.NoSuchProcess:  # gone since it was listed
            continue
    return pids


async def test_tools_are_listed_called_and_a_bad_server_is_isolated(ctx: ToolContext) -> None:
    servers = [
        spec("echo", env={"ECHO_MARK": "42"}),
        spec("broken", command=str(ctx.project_dir / "no-such-server")),
    ]
    async with McpToolset(servers, ctx) as toolset:
        tools = by_name(toolset.tools())
        assert set(tools) == {
            "mcp__echo__echo",
            "mcp__echo__fail",
            "mcp__echo__slow",
            "mcp__echo__spawn",
            "mcp__echo__crash",
            "mcp__echo__cwd",
        }
        assert toolset.failed_servers == ("broken",)
        echo = tools["mcp__echo__echo"]
        assert echo.parameters["type"] == "object"
        assert echo.description == "Echo the text back."
        assert isinstance(echo, McpTool)
        assert (echo.server_name, echo.tool_name) == ("echo", "echo")

        assert await call(echo, ctx, text="hi") == ToolOutcome("hi", timed_out=False)
        failed = await call(tools["mcp__echo__fail"], ctx)
        assert failed.is_error
        invalid = await call(echo, ctx)
        assert invalid.is_error

        # The server runs in the project with its own env and none of the service's.
        cwd = await call(tools["mcp__echo__cwd"], ctx)
        assert cwd.output == str(ctx.project_dir.resolve())
        for name, expected in (
            ("ECHO_MARK", "42"),
            ("MC_DAEMON_SOCKET", "<unset>"),
            ("ANTHROPIC_API_KEY", "<unset>"),
            ("CUSTOM_KEY", "<unset>"),
        ):
            outcome = await call(echo, ctx, text="x", env_name=name)
            assert outcome.output == f"x|{name}={expected}"


async def test_timeout_and_cancellation_fail_only_that_call(ctx: ToolContext) -> None:
    async with McpToolset([spec("echo")], ctx, call_timeout=0.5) as toolset:
        tools = by_name(toolset.tools())
        timed_out = await call(tools["mcp__echo__slow"], ctx, seconds=30)
        assert timed_out.is_error
        assert timed_out.timed_out is True

        task = asyncio.create_task(call(tools["mcp__echo__slow"], ctx, seconds=0.4))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        again = await call(tools["mcp__echo__echo"], ctx, text="still here")
        assert again == ToolOutcome("still here", timed_out=False)


async def test_a_crashed_server_fails_only_its_own_tools(ctx: ToolContext) -> None:
    async with McpToolset([spec("a"), spec("b")], ctx) as toolset:
        tools = by_name(toolset.tools())
        crashed = await call(tools["mcp__a__crash"], ctx)
        assert crashed.is_error
        after = await call(tools["mcp__a__echo"], ctx, text="x")
        assert after.is_error
        other = await call(tools["mcp__b__echo"], ctx, text="ok")
        assert other == ToolOutcome("ok", timed_out=False)


async def test_closing_the_toolset_leaves_no_process(ctx: ToolContext) -> None:
    async with McpToolset([spec("echo")], ctx) as toolset:
        spawned = await call(by_name(toolset.tools())["mcp__echo__spawn"], ctx)
        grandchild = int(spawned.output)
        servers = our_servers()
        assert len(live(servers)) == 1
        assert live([grandchild]) == [grandchild]
    assert live([*servers, grandchild]) == []
    assert toolset.tools() == []


async def test_unresponsive_server_is_skipped_and_stopped(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server ignores its stdin closing: the SDK kills it once its grace period (2 s,
    # the SDK's setting) is over; a short one reaches the kill as surely.
    monkeypatch.setattr("mcp.client.stdio.PROCESS_TERMINATION_TIMEOUT", 0.2)
    silent = spec("silent", args=("-c", "import time; time.sleep(300)"))
    async with McpToolset([silent], ctx, startup_timeout=0.5) as toolset:
        assert toolset.tools() == []
        assert toolset.failed_servers == ("silent",)
    assert live([child.pid for child in psutil.Process().children(recursive=True)]) == []


async def test_cancelling_startup_stops_the_servers(ctx: ToolContext) -> None:
    toolset = McpToolset([spec("echo")], ctx)
    task = asyncio.create_task(toolset.start())
    async with asyncio.timeout(10):
        while not our_servers():
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert live(our_servers()) == []


def test_tool_names_are_sanitized_and_bounded() -> None:
    assert mcp_tool_name("my server", "do.thing") == "mcp__my_server__do_thing"
    long_a = mcp_tool_name("s" * 40, "t" * 40 + "a")
    long_b = mcp_tool_name("s" * 40, "t" * 40 + "b")
    assert len(long_a) == len(long_b) == 64
    assert long_a != long_b
    assert all(char.isalnum() or char in "_-" for char in long_a)


def test_result_content_is_mapped_for_the_model() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(text="first"),
            types.ImageContent(data="AAAA", mime_type="image/png"),
            types.EmbeddedResource(
                resource=types.TextResourceContents(uri="file:///a.txt", text="embedded")
            ),
        ]
    )
    assert result_text(result) == "first\n[image content (image/png) not shown]\nembedded"
    structured = types.CallToolResult(content=[], structured_content={"n": 1})
    assert result_text(structured) == '{"n": 1}'
    assert result_text(types.CallToolResult(content=[])) == "(no output)"


async def test_a_server_gets_nothing_of_the_service_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK would fill HOME, LOGNAME, PATH, SHELL, TERM and USER from *this* process
    # (in a daemon: its own environment) under the launch environment it is given.
    for name in ("TERM", "SHELL", "LOGNAME", "USER"):
        monkeypatch.setenv(name, f"daemon-own-{name.lower()}")
    ctx = ToolContext(
        project_dir=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": "launch-user"},
    )
    async with McpToolset([spec("echo")], ctx) as toolset:
        echo = by_name(toolset.tools())["mcp__echo__echo"]
        for name, expected in (
            ("TERM", "<unset>"),
            ("SHELL", "<unset>"),
            ("LOGNAME", "<unset>"),
            ("HOME", "<unset>"),
            ("USER", "launch-user"),
        ):
            outcome = await call(echo, ctx, text="x", env_name=name)
            assert outcome.output == f"x|{name}={expected}"
