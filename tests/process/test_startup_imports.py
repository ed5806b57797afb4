"""What the real service processes import, read from ``python -X importtime``.

``-X importtime`` writes one line per module to stderr as each import finishes. The
embedded service serves a turn and its whole stderr is read. For the daemon, a foreground
``daemon run`` under ``-X importtime`` serves a turn through a shim, is stopped, and its
whole stderr is read.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from magi_code.protocol import envelope
from tests.process.daemon.support import cli, status, wait_for
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import running_service, service_env

STEP_TIMEOUT = 30.0
# The MCP SDK and what only it brings; none of it belongs to a turn without MCP servers.
MCP_SDK = ("mcp", "mcp_types", "pydantic", "pydantic_core", "starlette", "uvicorn", "cryptography")


def imported(lines: list[str]) -> list[str]:
    """Module names of ``-X importtime`` lines (other lines are ignored)."""
    names = []
    for line in lines:
        if line.startswith("import time:") and "imported package" not in line:
            names.append(line.rsplit("|", 1)[1].strip())
    return names


def among(names: list[str], packages: tuple[str, ...]) -> list[str]:
    """The ``names`` that are one of ``packages`` or inside one."""
    return sorted({n for n in names for p in packages if n == p or n.startswith(f"{p}.")})


def _request(request_id: str, method: str, payload: dict[str, object] | None = None) -> bytes:
    return orjson.dumps(envelope.request(request_id, method, payload)) + b"\n"


async def test_an_embedded_turn_without_mcp_servers_never_imports_the_sdk(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["Hel", "lo"]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "magi_code",
        "--app",
        "service",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=project,
        env=service_env(home, {"MC_SERVICE_MODE": "embedded"}),
        limit=1 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdout = proc.stdout
    before: list[str] = []
    after: list[str] = []
    messages: list[dict[str, Any]] = []

    async def until(predicate: Callable[[dict[str, Any]], bool]) -> None:
        """Read the shared stream up to the first message ``predicate`` accepts."""
        while True:
            line = (await asyncio.wait_for(stdout.readline(), STEP_TIMEOUT)).decode()
            assert line, "the service closed its output"
            if line.startswith("{"):
                messages.append(orjson.loads(line))
                if predicate(messages[-1]):
                    return
            else:
                (after if messages else before).append(line)

    try:
        proc.stdin.write(_request("init", "initialize", {"supported_protocol_versions": [1]}))
        await until(lambda m: m.get("request_id") == "init")
        assert messages[0]["error"] is None
        proc.stdin.write(_request("s", "status") + _request("t", "turn.start", {"prompt": "hi"}))
        await until(lambda m: m.get("event") == "turn.terminal")
        proc.stdin.close()
        rest = (await asyncio.wait_for(stdout.read(), STEP_TIMEOUT)).decode()
        after.extend(rest.splitlines())
        assert await asyncio.wait_for(proc.wait(), STEP_TIMEOUT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    terminal = messages[-1]
    assert terminal["payload"]["status"] == "completed", terminal
    names = imported(before + after)
    assert "magi_code.core.turns" in names and "httpcore" in names  # the check sees them
    assert among(names, MCP_SDK) == []


async def importtime_daemon(home: Path, cwd: Path | None = None) -> asyncio.subprocess.Process:
    """``magi-code daemon run`` in the foreground, its import times on stderr (a pipe)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "magi_code",
        "daemon",
        "run",
        env=service_env(home, {"MC_DAEMON_IDLE_SECONDS": "0"}),
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_a_daemon_turn_without_mcp_servers_never_imports_the_sdk(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["Hel", "lo"]))
    daemon = await importtime_daemon(home, project)
    assert daemon.stderr is not None
    # Read from the start: a full pipe would stop the daemon in its next import line.
    stderr = asyncio.create_task(daemon.stderr.read())
    try:
        await wait_for(lambda: "instance_id" in status(home), 60, "the daemon to answer")
        async with running_service(home, project, {"MC_SERVICE_MODE": "daemon"}) as shim:
            started = await shim.request("turn.start", {"prompt": "hi"})
            assert started["error"] is None, started
            events = await shim.events_until_terminal(started["request_id"])
            assert events[-1]["payload"]["status"] == "completed", events[-1]
            assert (await asyncio.to_thread(status, home))["pid"] == daemon.pid
        # The last shim of this home stopped the daemon on its way out.
        assert await asyncio.wait_for(daemon.wait(), 60) == 0
        err = (await asyncio.wait_for(stderr, STEP_TIMEOUT)).decode(errors="replace")
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
        stderr.cancel()
    names = imported(err.splitlines())
    assert "magi_code.tools.mcp" in names and "magi_code.composition" in names  # preload
    assert "httpcore" in names  # warmed
    assert among(names, MCP_SDK) == []


async def test_a_ready_daemon_loads_the_http_stack_of_turns_before_any_turn(home: Path) -> None:
    daemon = await importtime_daemon(home)
    assert daemon.stderr is not None
    lines: list[str] = []

    async def read_until_warmed() -> None:
        assert daemon.stderr is not None
        while "anyio._backends._asyncio" not in imported(lines):
            line = await daemon.stderr.readline()
            assert line, "the daemon exited"
            lines.append(line.decode(errors="replace").rstrip("\n"))

    try:
        # Ready first (nothing of the HTTP stack is needed to answer), then loaded
        # without any client asking for anything.
        await asyncio.wait_for(read_until_warmed(), 60)
        assert "magi_code.composition" in imported(lines)
        assert {"httpx", "httpcore", "h11"} <= set(imported(lines))
    finally:
        stopped = await asyncio.to_thread(cli, home, "daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert await asyncio.wait_for(daemon.wait(), 60) == 0
