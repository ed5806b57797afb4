"""Warm MCP servers through the real service (embedded and via the daemon): one server
process serves three turns, a settings change or a killed server gets a new process, a
paginated listing is offered whole, ``tools/list_changed`` reaches the next provider
request of the same turn, and the connection's end leaves no server process behind."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.process.turn_support import run_turn, strings_in, write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, RecordedRequest, Reply
from tests.support.service import ServiceProcess, running_service

# Both modes: warm servers end with the process (embedded) or with its connection (daemon).
pytestmark = pytest.mark.both_modes

PAGED = str(Path(__file__).parents[1] / "unit" / "tools" / "mcp_paged_server.py")
PAGED_TOOLS = {f"mcp__srv__{n}" for n in ("pid", "grow", "sleep", "t1", "t2", "t3", "t4")}


def configure(home: Path, fake: FakeProviderServer, tag: str) -> None:
    server = {"command": sys.executable, "args": [PAGED, "--tag", tag]}
    write_settings(home, fake, mcp_servers={"srv": server})


def servers_in(project: Path) -> list[int]:
    """This test's MCP server processes (they run in its project directory)."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if (
                PAGED in proc.cmdline()
                and Path(proc.cwd()) == project.resolve()
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                pids.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return pids


async def until(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def offered(request: RecordedRequest) -> set[str]:
    return {tool["function"]["name"] for tool in request.json["tools"]}


async def pid_turn(svc: ServiceProcess, fake: FakeProviderServer, call_id: str) -> str:
    """One turn that calls ``pid``; returns what the server answered (``pid:tag``)."""
    fake.enqueue(
        Reply(text=[], tool_calls=[FakeToolCall(call_id, "mcp__srv__pid", "{}")]),
        Reply(text=["ok"]),
    )
    _, turn = await run_turn(svc, "which server?")
    assert turn.terminal["status"] == "completed"
    answer = fake.requests[-1]
    found = {m for s in strings_in(answer.json) for m in re.findall(r"\b\d+:[a-z]+\b", s)}
    assert len(found) == 1, found
    return found.pop()


async def test_one_server_process_serves_turns_until_settings_change_or_it_dies(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    configure(home, fake, "a")
    async with running_service(home, project) as svc:
        answers = [await pid_turn(svc, fake, f"p{i}") for i in range(3)]
        assert len(set(answers)) == 1 and answers[0].endswith(":a")
        first = int(answers[0].split(":")[0])
        assert servers_in(project) == [first]
        # Every page of the listing was offered to the model.
        assert offered(fake.requests[0]) >= PAGED_TOOLS

        configure(home, fake, "b")  # the server's definition changed
        changed = await pid_turn(svc, fake, "p3")
        assert changed.endswith(":b")
        second = int(changed.split(":")[0])
        assert second != first
        await until(lambda: servers_in(project) == [second])

        os.kill(second, signal.SIGKILL)  # the server died between turns
        await until(lambda: second not in servers_in(project))
        restarted = await pid_turn(svc, fake, "p4")
        third = int(restarted.split(":")[0])
        assert restarted.endswith(":b") and third not in (first, second)
        assert servers_in(project) == [third]
    # The connection ended: nothing of its servers is left.
    await until(lambda: servers_in(project) == [])


async def test_a_tool_list_change_reaches_the_next_request_of_the_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    configure(home, fake, "a")
    fake.enqueue(
        Reply(text=[], tool_calls=[FakeToolCall("g1", "mcp__srv__grow", "{}")]),
        Reply(text=[], tool_calls=[FakeToolCall("x1", "mcp__srv__extra1", "{}")]),
        Reply(text=["grown"]),
    )
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "grow the tools")
        assert turn.terminal["status"] == "completed"
        posts = [r for r in fake.requests if r.method == "POST"]
        assert len(posts) == 3
        assert "mcp__srv__extra1" not in offered(posts[0])
        assert offered(posts[1]) == offered(posts[0]) | {"mcp__srv__extra1"}
        # The new tool was callable: its result went back to the model.
        tool_messages = [m for m in posts[2].json["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in tool_messages] == ["extra1", "extra1"]
        # The next turn (same warm server) offers the grown list from its first request.
        fake.enqueue(Reply(text=["again"]))
        await run_turn(svc, "and now?")
        assert "mcp__srv__extra1" in offered(fake.requests[-1])
        assert len(servers_in(project)) == 1
    await until(lambda: servers_in(project) == [])


async def test_a_turn_cancelled_mid_call_leaves_the_warm_server_serving(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    configure(home, fake, "a")
    sleep = FakeToolCall("s1", "mcp__srv__sleep", json.dumps({"seconds": 30}))
    fake.enqueue(Reply(text=[], tool_calls=[sleep]))
    async with running_service(home, project) as svc:
        rid = svc.next_id("turn")
        response = await svc.request(
            "turn.start", {"prompt": "sleep", "options": {}}, request_id=rid
        )
        turn_id = response["payload"]["turn_id"]
        await until(lambda: len(servers_in(project)) == 1)
        await asyncio.sleep(0.5)  # the call is in flight
        cancel = await svc.request("turn.cancel", {"turn_id": turn_id})
        assert cancel["error"] is None
        events = await svc.events_until_terminal(rid)
        assert events[-1]["payload"]["status"] == "cancelled"
        [pid] = servers_in(project)
        answer = await pid_turn(svc, fake, "p1")
        assert answer.startswith(f"{pid}:")
    await until(lambda: servers_in(project) == [])
