"""Helpers for daemon tests: CLI runs, launch contexts, v2 clients, the lock and info files."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from magi_code.client import ApprovalRequest, Client
from magi_code.daemonctl.commands import query_daemon
from magi_code.endpoint.paths import RuntimePaths, runtime_paths
from magi_code.storage.launch import LaunchContext
from tests.process.turn_support import replay_all
from tests.support.service import ServiceProcess, service_env, stop_daemon


def context(home: Path, project: Path, extra: Mapping[str, str] | None = None) -> LaunchContext:
    return LaunchContext(home, project, service_env(home, extra))


def paths(home: Path) -> RuntimePaths:
    return runtime_paths(LaunchContext(home, home, service_env(home)))


def cli(
    home: Path, *args: str, extra: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magi_code", *args],
        env=service_env(home, extra),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def status(home: Path) -> dict[str, Any]:
    """``magi-code daemon status --json``'s document, made by the command's own code in this
    process (on a thread of its own: the caller may be on an event loop), over the real
    socket: a probe spares the test an interpreter start. The command itself, its output
    and exit codes, is tested through the command line (test_daemon_lifecycle, _journal,
    _upgrade and _identity)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(query_daemon, context(home, home)).result(timeout=90)


async def persistent(home: Path, project: Path, **extra: str) -> Client:
    client = await Client.connect(context(home, project, extra), "persistent")
    init = await client.request("initialize", {"supported_protocol_versions": [1]})
    assert init["error"] is None, init
    return client


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def exited(pid: int, timeout: float = 20.0) -> None:
    """Wait until ``pid`` has exited: gone, or a zombie nobody reaps (daemons are not our
    children, and a container's init may not reap them)."""

    def gone() -> bool:
        try:
            return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True

    await wait_for(gone, timeout, f"pid {pid} to exit")


async def wait_for(predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def replay_in_new_shim(home: Path, project: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's whole replay, read through a fresh v1 shim."""
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        return await replay_all(svc, session_id)
    finally:
        await svc.close_stdin()
        await svc.wait()


def start_foreground(
    home: Path, extra: Mapping[str, str], stderr_path: Path
) -> subprocess.Popen[bytes]:
    """``daemon run`` as a real foreground process (as a unit starts it), with ``extra`` in
    its environment and its stderr appended to ``stderr_path``."""
    with open(stderr_path, "ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "magi_code", "daemon", "run"],
            env=service_env(home, extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def end_foreground(home: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop every ``daemon run`` of ``procs`` still running (killed if it does not exit)."""
    for proc in procs:
        if proc.poll() is None:
            stop_daemon(home)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def answered_turn(
    client: Client, decision: str, session_id: str | None = None
) -> tuple[dict[str, Any], ApprovalRequest | None]:
    """Start a turn (its replies already enqueued), answer every approval request of it
    with ``decision``, and wait for its end: (the ``turn.terminal`` payload, the last
    request asked, or None)."""
    started = await client.request("turn.start", {"prompt": "go"}, session_id=session_id)
    assert started["payload"] is not None, started
    turn_id = started["payload"]["turn_id"]
    asked = None
    async with asyncio.timeout(30):
        while True:
            event = await client.next_event()
            assert event is not None
            if isinstance(event, ApprovalRequest):
                asked = event
                await client.answer_approval(event.approval_id, decision)
            elif (
                isinstance(event, dict)
                and event["event"] == "turn.terminal"
                and event["payload"]["turn_id"] == turn_id
            ):
                return dict(event["payload"]), asked
