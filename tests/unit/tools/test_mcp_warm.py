"""Warm MCP servers (``McpServers``): one server process serves many leases, restarts
when its definition changes or it died, follows ``tools/list_changed`` and paginated
listings, serves concurrent leases at once, survives a cancelled caller, and stops when
its connections end or it has been idle (real stdio servers, counted by pid)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from magi_code.tools.base import Tool, ToolContext, ToolOutcome, run_tool
from magi_code.tools.mcp import McpLease, McpServers, McpServerSpec

PAGED = str(Path(__file__).with_name("mcp_paged_server.py").resolve())
ECHO = str(Path(__file__).with_name("mcp_echo_server.py").resolve())
ALL_PAGED_TOOLS = {f"mcp__srv__{n}" for n in ("pid", "grow", "sleep", "t1", "t2", "t3", "t4")}


def paged(tag: str = "a", name: str = "srv", env: Mapping[str, str] | None = None) -> McpServerSpec:
    return McpServerSpec(name, sys.executable, (PAGED, "--tag", tag), env or {})


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(project_dir=tmp_path, env={"PATH": os.environ.get("PATH", "/bin")})


@pytest.fixture
async def servers() -> AsyncIterator[McpServers]:
    registry = McpServers()
    yield registry
    await registry.aclose()


def server_pids(script: str = PAGED) -> list[int]:
    pids = []
    for child in psutil.Process().children(recursive=True):
        try:
            if script in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                pids.append(child.pid)
        except psutil.Error:
            continue
    return pids


async def gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [pid for pid in pids if psutil.pid_exists(pid) and _alive(pid)]:
            return True
        await asyncio.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


async def call(lease: McpLease, name: str, ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(by_name(lease.tools())[name], json.dumps(arguments), ctx)


async def pid_of(lease: McpLease, ctx: ToolContext) -> int:
    outcome = await call(lease, "mcp__srv__pid", ctx)
    assert not outcome.is_error, outcome
    return int(outcome.output.split(":")[0])


def conn(owner: object) -> SimpleNamespace:
    return SimpleNamespace(ctx=owner)


async def test_one_server_process_serves_three_leases_with_its_paged_listing(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()
    pids = []
    for _ in range(3):
        async with servers.lease(owner, [paged()], ctx) as lease:
            # Seven tools two per page: every page was followed.
            assert set(by_name(lease.tools())) == ALL_PAGED_TOOLS
            assert lease.failed_servers == ()
            pids.append(await pid_of(lease, ctx))
        assert server_pids() == [pids[0]]  # still running between turns
    assert len(set(pids)) == 1
    assert servers.running == 1
    await servers.connection_closed(conn(owner))
    assert await gone(pids)
    assert server_pids() == []
    assert servers.running == 0


async def test_concurrent_leases_call_one_server_at_the_same_time(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner_a, owner_b = object(), object()
    async with (
        servers.lease(owner_a, [paged()], ctx) as first,
        servers.lease(owner_b, [paged()], ctx) as second,
    ):
        assert await pid_of(first, ctx) == await pid_of(second, ctx)
        started = time.monotonic()
        answers = await asyncio.gather(
            call(first, "mcp__srv__sleep", ctx, seconds=1.0),
            call(second, "mcp__srv__sleep", ctx, seconds=1.0),
        )
        assert [a.output for a in answers] == ["slept", "slept"]
        assert time.monotonic() - started < 1.8  # not one after the other
    assert len(server_pids()) == 1


async def test_a_cancelled_call_is_abandoned_and_the_shared_server_keeps_serving(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()
    async with servers.lease(owner, [paged()], ctx) as other:
        pid = await pid_of(other, ctx)

        async def turn() -> None:
            async with servers.lease(owner, [paged()], ctx) as lease:
                await call(lease, "mcp__srv__sleep", ctx, seconds=30)

        task = asyncio.create_task(turn())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await pid_of(other, ctx) == pid
    async with servers.lease(owner, [paged()], ctx) as later:
        assert await pid_of(later, ctx) == pid


async def test_a_cancelled_start_leaves_the_shared_start_running(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()

    async def enter() -> None:
        async with servers.lease(owner, [paged()], ctx):
            pass

    task = asyncio.create_task(enter())
    deadline = time.monotonic() + 10
    while not server_pids():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    started = server_pids()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with servers.lease(owner, [paged()], ctx) as lease:
        assert [await pid_of(lease, ctx)] == started


async def test_changed_settings_restart_the_server_and_stop_the_old_one(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()
    async with servers.lease(owner, [paged("a")], ctx) as lease:
        before = await pid_of(lease, ctx)
    async with servers.lease(owner, [paged("b")], ctx) as lease:
        outcome = await call(lease, "mcp__srv__pid", ctx)
        after = int(outcome.output.split(":")[0])
        assert outcome.output.endswith(":b")
    assert after != before
    assert await gone([before])
    assert server_pids() == [after]
    # The server's own env and the launch environment are part of its identity too.
    async with servers.lease(owner, [paged("b", env={"X": "1"})], ctx) as lease:
        with_env = await pid_of(lease, ctx)
    other_ctx = ToolContext(ctx.project_dir, {**ctx.env, "LANG": "C.UTF-8"})
    async with servers.lease(owner, [paged("b", env={"X": "1"})], other_ctx) as lease:
        with_launch_env = await pid_of(lease, other_ctx)
    assert len({after, with_env, with_launch_env}) == 3
    assert await gone([after, with_env])
    # No servers configured any more: the owner's last one stops too.
    async with servers.lease(owner, [], ctx) as lease:
        assert lease.tools() == []
    assert await gone([with_launch_env])


async def test_a_killed_server_is_restarted_by_the_next_lease(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()
    async with servers.lease(owner, [paged()], ctx) as lease:
        first = await pid_of(lease, ctx)
        os.kill(first, signal.SIGKILL)
        assert await gone([first])
        dead = await call(lease, "mcp__srv__pid", ctx)
        assert dead.is_error  # this lease's call fails; the turn goes on
    async with servers.lease(owner, [paged()], ctx) as lease:
        second = await pid_of(lease, ctx)
    assert second != first
    assert server_pids() == [second]


async def test_tools_list_changed_is_picked_up_between_requests_and_turns(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()
    async with servers.lease(owner, [paged()], ctx) as lease:
        assert await lease.refresh() is False
        grown = await call(lease, "mcp__srv__grow", ctx)
        assert grown.output == "extra1"
        assert "mcp__srv__extra1" not in by_name(lease.tools())
        assert await lease.refresh() is True  # the agent asks before its next request
        assert set(by_name(lease.tools())) == ALL_PAGED_TOOLS | {"mcp__srv__extra1"}
        assert (await call(lease, "mcp__srv__extra1", ctx)).output == "extra1"
        assert await lease.refresh() is False
        # A concurrent lease of the same server sees the new listing as well.
        async with servers.lease(object(), [paged()], ctx) as other:
            assert "mcp__srv__extra1" in by_name(other.tools())
        await call(lease, "mcp__srv__grow", ctx)
    # Changed after the turn ended: the next turn starts with the current list.
    async with servers.lease(owner, [paged()], ctx) as lease:
        assert {"mcp__srv__extra1", "mcp__srv__extra2"} <= set(by_name(lease.tools()))


async def test_a_closed_connection_stops_only_what_no_one_else_uses(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner_a, owner_b = object(), object()
    async with servers.lease(owner_a, [paged()], ctx) as lease:
        pid = await pid_of(lease, ctx)
    async with servers.lease(owner_b, [paged()], ctx) as lease:
        assert await pid_of(lease, ctx) == pid
    await servers.connection_closed(conn(owner_a))
    assert server_pids() == [pid]
    async with servers.lease(owner_b, [paged()], ctx) as lease:
        # Closed while a turn still uses it: it stops when that use ends.
        await servers.connection_closed(conn(owner_b))
        assert await pid_of(lease, ctx) == pid
    assert await gone([pid])


async def test_connection_end_leaves_no_process_of_a_server(
    servers: McpServers, ctx: ToolContext
) -> None:
    owner = object()
    echo = McpServerSpec("echo", sys.executable, (ECHO,))
    async with servers.lease(owner, [echo], ctx) as lease:
        spawned = await run_tool(by_name(lease.tools())["mcp__echo__spawn"], "{}", ctx)
        grandchild = int(spawned.output)
        server = server_pids(ECHO)
    assert _alive(grandchild) and len(server) == 1
    await servers.connection_closed(conn(owner))
    assert not [pid for pid in [*server, grandchild] if _alive(pid)]


async def test_idle_servers_stop_and_a_detached_owner_leaves_them_to_the_idle_stop(
    ctx: ToolContext,
) -> None:
    servers = McpServers(idle_seconds=0.6)
    try:
        owner = object()
        async with servers.lease(owner, [paged()], ctx) as lease:
            first = await pid_of(lease, ctx)
            await asyncio.sleep(1.0)  # in use: not idle however long it takes
            assert _alive(first)
        assert await gone([first], timeout=5)  # no turn used it for the idle period
        assert servers.running == 0
        async with servers.lease(owner, [paged()], ctx) as lease:
            second = await pid_of(lease, ctx)
        assert second != first
        await servers.connection_detached(conn(owner))
        assert _alive(second)  # the client may come back, or its turns still run
        assert await gone([second], timeout=5)
    finally:
        await servers.aclose()
    assert server_pids() == []


async def test_a_server_that_cannot_start_is_tried_again_by_the_next_lease(
    servers: McpServers, ctx: ToolContext, tmp_path: Path
) -> None:
    script = tmp_path / "late-server"
    missing = McpServerSpec("srv", str(script), ())
    async with servers.lease(object(), [missing], ctx) as lease:
        assert lease.tools() == [] and lease.failed_servers == ("srv",)
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {PAGED} --tag late\n")
    script.chmod(0o755)
    async with servers.lease(object(), [missing], ctx) as lease:
        assert lease.failed_servers == ()
        assert (await call(lease, "mcp__srv__pid", ctx)).output.endswith(":late")


async def test_aclose_stops_every_server(ctx: ToolContext) -> None:
    servers = McpServers()
    async with servers.lease(object(), [paged("a")], ctx) as first:
        a = await pid_of(first, ctx)
    async with servers.lease(object(), [paged("b")], ctx) as second:
        b = await pid_of(second, ctx)
    await servers.aclose()
    assert not [pid for pid in (a, b) if _alive(pid)]


def test_a_lease_without_servers_loads_no_sdk(tmp_path: Path) -> None:
    code = (
        "import asyncio, json, sys\n"
        "from pathlib import Path\n"
        "from magi_code.tools.base import ToolContext\n"
        "from magi_code.tools.mcp import McpServers\n"
        "async def main():\n"
        "    servers = McpServers()\n"
        f"    ctx = ToolContext(project_dir=Path({str(tmp_path)!r}), env={{}})\n"
        "    async with servers.lease(object(), [], ctx) as lease:\n"
        "        assert lease.tools() == [] and await lease.refresh() is False\n"
        "    await servers.connection_closed(type('C', (), {'ctx': 1})())\n"
        "    await servers.aclose()\n"
        "asyncio.run(main())\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "    ('mcp', 'mcp_types', 'pydantic', 'anyio', 'starlette'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_servers_still_warm_when_the_event_loop_ends_are_stopped(tmp_path: Path) -> None:
    # As at the daemon's exit: no aclose(), the loop cancels what is left. The echo
    # server's grandchild would outlive a server that merely exits on stdin EOF.
    code = (
        "import asyncio, os, sys\n"
        "from pathlib import Path\n"
        "import psutil\n"
        "from magi_code.tools.base import ToolContext, run_tool\n"
        "from magi_code.tools.mcp import McpServers, McpServerSpec\n"
        "async def main():\n"
        "    servers = McpServers()\n"
        "    env = {'PATH': os.environ['PATH']}\n"
        f"    ctx = ToolContext(project_dir=Path({str(tmp_path)!r}), env=env)\n"
        f"    spec = McpServerSpec('echo', sys.executable, ({ECHO!r},))\n"
        "    async with servers.lease(object(), [spec], ctx) as lease:\n"
        "        [tool] = [t for t in lease.tools() if t.name == 'mcp__echo__spawn']\n"
        "        spawned = int((await run_tool(tool, '{}', ctx)).output)\n"
        "    server = [c.pid for c in psutil.Process().children() if "
        f"{ECHO!r} in c.cmdline()]\n"
        "    return servers, [*server, spawned]\n"
        "servers, pids = asyncio.run(main())  # still warm: nobody closed them\n"
        "def alive(pid):\n"
        "    try:\n"
        "        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE\n"
        "    except psutil.NoSuchProcess:\n"
        "        return False\n"
        "print(len(pids), [pid for pid in pids if alive(pid)])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.splitlines()[-1] == "2 []"
