"""Every process the daemon starts is accounted for: a tool's forked grandchildren end
with its turn, the child limit gives the fixed tool error, and after ``daemon stop``
nothing the daemon started (tools, their background jobs, MCP servers) is left.

A grandchild that calls ``setsid`` itself leaves the tool's process group; catching
those is the subreaper's work, not tested here.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import psutil

from magi_code.client import Client
from magi_code.tools.processes import MAX_CHILDREN_ENV
from tests.process.daemon.support import cli, exited, paths, persistent, status, wait_for
from tests.process.turn_support import held_shell, posted_bodies, strings_in, write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply

LIMIT_ERROR = (
    "Not started: too many processes are running (at most 16 for one turn and 1 in all); "
    "wait for some to finish, then try again."
)


def shell_call(call_id: str, command: str) -> Reply:
    return Reply(
        text=[], tool_calls=[FakeToolCall(call_id, "shell", json.dumps({"command": command}))]
    )


async def terminal(client: Client) -> dict[str, Any]:
    async for event in client.events():
        if event["event"] == "turn.terminal":
            return dict(event["payload"])
    raise AssertionError("the connection ended before the turn did")


async def start(client: Client, prompt: str) -> None:
    reply = await client.request("turn.start", {"prompt": prompt})
    assert reply["error"] is None, reply


def live(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def forks(pids: Path) -> str:
    """Shell text that starts a background job and a double-forked orphan (both sleeping
    long), noting their pids in ``pids``."""
    return f"sleep 300 & echo $! >> {pids}; (sleep 300 & echo $! >> {pids}) ; "


async def test_a_tool_s_forked_grandchildren_end_with_its_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    pids = project / "pids"
    fake.enqueue(shell_call("t1", forks(pids) + "exit 0"), Reply(text=["done"]))
    client = await persistent(home, project)
    try:
        await start(client, "fork and leave")
        assert (await asyncio.wait_for(terminal(client), 60))["status"] == "completed"
        started = [int(line) for line in pids.read_text().split()]
        assert len(started) == 2
        for pid in started:
            await exited(pid)
        # The daemon adopted the orphans (a subreaper) and reaps each within seconds (and
        # its own sandbox probe, a worker child while it runs, is over).
        for _ in range(200):
            health = dict(await client.status())
            if health["zombies"] == 0 and health["sandbox"]["workspace_write"] is not None:
                break
            await asyncio.sleep(0.1)
        assert sum(health["children"].values()) == 0 and health["zombies"] == 0
    finally:
        await client.close()


async def test_past_the_child_limit_a_tool_gets_the_fixed_error(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release, hold = held_shell(project)
    marker = project / "ran"
    fake.route("holding-turn", shell_call("h1", hold), Reply(text=["held"]))
    fake.route("refused-turn", shell_call("r1", f"touch {marker}"), Reply(text=["refused"]))
    first = await persistent(home, project, **{MAX_CHILDREN_ENV: "1"})
    second = await persistent(home, project)
    try:
        await start(first, "holding-turn")
        await wait_for(started.exists, 60, "the holding tool to start")
        await start(second, "refused-turn")
        assert (await asyncio.wait_for(terminal(second), 60))["status"] == "completed"
        release.touch()
        assert (await asyncio.wait_for(terminal(first), 60))["status"] == "completed"
    finally:
        await first.close()
        await second.close()
    assert not marker.exists()
    results = [
        text
        for body in posted_bodies(fake)
        for text in strings_in(body)
        if text.startswith("Not started")
    ]
    assert results == [LIMIT_ERROR]


async def test_nothing_the_daemon_started_is_left_after_daemon_stop(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    servers = {"clock": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}}
    write_settings(home, fake, mcp_servers=servers)
    pids, started = project / "pids", project / "started"
    clock = FakeToolCall("c1", "mcp__clock__get_current_time", json.dumps({"timezone": "UTC"}))
    fake.enqueue(
        Reply(text=[], tool_calls=[clock]),
        shell_call("t1", forks(pids) + f"touch {started}; sleep 300"),
    )
    client = await persistent(home, project)
    try:
        await start(client, "start things and wait")
        await wait_for(started.exists, 60, "the tool to start")
        daemon = psutil.Process(status(home)["pid"])
        descendants = daemon.children(recursive=True)
        health = dict(await client.status())
        assert health["children"]["tool"] == 1 and health["children"]["mcp_server"] == 1
        stopped = await asyncio.to_thread(cli, home, "daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
    finally:
        await client.close()
    await exited(daemon.pid)
    orphans = [int(line) for line in pids.read_text().split()]
    assert len(orphans) == 2 and len(descendants) >= 4  # shell, 2 sleeps, MCP server
    for pid in {*orphans, *(p.pid for p in descendants)}:
        await wait_for(lambda pid=pid: not live(pid), 20, f"pid {pid} to end")
    assert not paths(home).socket.exists()
