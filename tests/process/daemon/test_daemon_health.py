"""A real daemon's health in ``status`` (control, v2 and ``daemon status``), and its log
rotated by size."""

from __future__ import annotations

import asyncio
import json
import platform
import stat
from pathlib import Path
from typing import Any

import pytest

from magi_code.client import Client
from tests.process.daemon.support import cli, context, paths, persistent, status, wait_for
from tests.process.turn_support import held_shell, tool_call, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.glibc_arenas import secondary_arenas

CHILD_KINDS = {"tool", "hook", "mcp_server", "worker", "other"}
ROLES = {"v1_shim", "persistent", "control", "handshake"}


def _check_health(doc: dict[str, Any], *, tools: int, control: int) -> None:
    # A zombie is transient here: an orphan the subreaper adopted is reaped after it has
    # been one for a second (the callers wait for ``zombies`` 0 where it must settle).
    assert doc["uptime_seconds"] >= 0
    assert doc["rss_bytes"] > 0 and doc["open_fds"] > 0 and doc["threads"] > 0
    assert set(doc["children"]) == CHILD_KINDS
    assert doc["children"] == {**dict.fromkeys(CHILD_KINDS, 0), "tool": tools}
    assert doc["zombies"] >= 0
    assert set(doc["connections"]) == ROLES
    assert doc["connections"]["persistent"] == 1
    assert doc["connections"]["control"] == control
    assert doc["max_outbound_queued_bytes"] >= 0


async def _settled(read: Any) -> dict[str, Any]:
    """A status once no zombie is left (each is reaped within seconds) and the sandbox
    probe the daemon runs after its start (a ``worker`` child meanwhile) has finished."""
    for _ in range(300):
        doc = dict(await read())
        if doc["zombies"] == 0 and doc["sandbox"]["workspace_write"] is not None:
            return doc
        await asyncio.sleep(0.1)
    raise AssertionError(f"a zombie child or the sandbox probe stayed: {doc}")


async def _terminal(client: Client) -> dict[str, Any]:
    async for event in client.events():
        if event["event"] == "turn.terminal":
            return dict(event["payload"])
    raise AssertionError("the connection ended before the turn did")


async def test_status_reports_health_and_counts_a_running_tool_child(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release, command = held_shell(project)
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("t1", "shell", command=command)]),
        Reply(text=["done"]),
    )
    client = await persistent(home, project)
    try:
        before = await _settled(lambda: asyncio.to_thread(status, home))
        _check_health(before, tools=0, control=1)
        assert before["active_turns"] == 0 and before["retained_turns"] == 0
        assert before["retained_turn_bytes"] == 0

        reply = await client.request("turn.start", {"prompt": "run it"})
        assert reply["error"] is None, reply
        await wait_for(started.exists, 60, "the tool to start")
        # ``daemon status --json`` (its own control connection) and v2 ``status``.
        during = await asyncio.to_thread(status, home)
        _check_health(during, tools=1, control=1)
        during_v2 = dict(await client.status())
        _check_health(during_v2, tools=1, control=0)
        for doc in (during, during_v2):
            assert doc["active_turns"] == 1 and doc["retained_turns"] == 0
            assert doc["sessions_held"] == 1
            assert doc["build_id"] == before["build_id"]

        release.touch()
        terminal = await asyncio.wait_for(_terminal(client), 60)
        assert terminal["status"] == "completed", terminal
        after = await _settled(client.status)
        _check_health(after, tools=0, control=0)
        assert after["active_turns"] == 0 and after["retained_turns"] == 1
        # Its events, as encoded: at least the terminal with the reply's text.
        assert after["retained_turn_bytes"] > len(terminal["assistant_text"])
    finally:
        await client.close()

    text = await asyncio.to_thread(cli, home, "daemon", "status")
    assert text.returncode == 0, text.stderr
    assert "children: tool 0, hook 0, mcp_server 0, worker 0, other 0; zombies 0" in text.stdout
    assert "1 finished turns retained" in text.stdout
    doctor = json.loads((await asyncio.to_thread(cli, home, "doctor", "--json")).stdout)
    health = [c for c in doctor["checks"] if c["check"] == "daemon_health"]
    assert [c["status"] for c in health] == ["ok"], doctor


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="arenas are glibc's")
async def test_the_daemons_threads_allocate_from_one_arena(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    # A tool turn and a plain one: worker threads read and parse the session, run the
    # tool's process and write the history. None may keep a free heap of its own.
    write_settings(home, fake)
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("t1", "shell", command="echo hi")]),
        Reply(text=["done"]),
        Reply(text=["again"]),
    )
    async with await persistent(home, project) as client:
        session_id = None
        for prompt in ("run it", "once more"):
            options = {} if session_id is None else {"session_id": session_id}
            reply = await client.request("turn.start", {"prompt": prompt}, **options)
            assert reply["error"] is None, reply
            session_id = reply["payload"]["session_id"]
            assert (await _terminal(client))["status"] == "completed"
        pid = (await client.status())["pid"]
        maps = await asyncio.to_thread(Path(f"/proc/{pid}/maps").read_text)
    assert secondary_arenas(maps) == 0


async def test_daemon_log_rotates_by_size_and_keeps_three_private_backups(
    home: Path, project: Path
) -> None:
    limit = 4096
    ctx = context(home, project, {"MC_DAEMON_LOG_BYTES": str(limit)})
    log = paths(home).log
    backups = [log.with_name(f"{log.name}.{i}") for i in (1, 2, 3, 4)]
    # Each connection logs a line (~80 bytes): enough of them for several rotations.
    for _ in range(1000):
        client = await Client.connect(ctx, "control")
        await client.close()
        if backups[2].exists():
            break
    assert backups[2].exists(), "daemon.log was not rotated three times"
    for _ in range(100):  # past a fourth rotation: the oldest backup goes
        client = await Client.connect(ctx, "control")
        await client.close()
    assert not backups[3].exists()
    for path in (log, *backups[:3]):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for path in backups[:3]:
        assert 0 < path.stat().st_size <= limit
        assert "connection role=control" in path.read_text()
    assert log.stat().st_size <= limit
