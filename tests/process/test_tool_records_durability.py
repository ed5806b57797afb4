"""Every event a client received has its record on disk after a kill -9 mid tool-heavy turn.

Session records are group-committed and a turn does not wait for each fsync; instead
each event is released only once every record submitted before it is durable
(``core/turns.py``, ``sessions/commit.py``). The test runs a turn of many ``list_files``
calls and reads some of its events. Then it takes ``append.lock`` shared, as any reader
of the session does, so no batch can be written meanwhile while the turn keeps running
its tools, reads whatever else arrives for a while, and SIGKILLs the process running the
turn (the service, or the daemon) with the lock still held: records queued in memory are
lost, and the client must not have seen an event that depends on them. Finally it reads
``history.jsonl`` itself: each tool activity the client saw has its ``tool_call``
record, and a ``context`` activity of provider request ``k`` has the ``tool_result``
records of every call of the requests before it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.sessions.records import ToolCallRecord, ToolResultRecord, UserRecord, decode_line
from magi_code.turns.activity import identity
from tests.process.daemon.support import status, wait_for
from tests.process.turn_support import start_turn, write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.service import ServiceProcess

HOLD_SECONDS = 0.5  # well below the 5 s an append waits for the lock
ROUND_DELAY = 0.08
ROUNDS = 23  # tool replies, then a final text reply: the agent's 24 provider requests
CALLS = 16
LIST = orjson.dumps({"pattern": "**/*.py"}).decode()


def _calls(round_no: int) -> list[str]:
    return [f"call-{round_no}-{i}" for i in range(CALLS)]


def _script(fake: FakeProviderServer) -> None:
    # Each reply takes a while, so the turn is still running when the client has read
    # its first events, even when the client lags behind (the daemon's shim buffers).
    for r in range(ROUNDS):
        tools = [FakeToolCall(call_id, "list_files", LIST) for call_id in _calls(r)]
        fake.enqueue(Reply(text=(f"round {r}. ",), chunk_delay=ROUND_DELAY, tool_calls=tools))
    fake.enqueue(Reply(text=("Done.",)))


def _kill_the_turns_process(svc: ServiceProcess, home: Path) -> None:
    if svc.mode == "daemon":
        pid = status(home)["pid"]
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGKILL)
    else:
        svc.proc.send_signal(signal.SIGKILL)


def _records(home: Path, session_id: str) -> tuple[str, set[str], set[str]]:
    """The turn ID, the call IDs with a tool_call and those with a tool_result on disk."""
    data = (home / "sessions" / session_id / "history.jsonl").read_bytes()
    turn_id = ""
    calls: set[str] = set()
    results: set[str] = set()
    for line in data.split(b"\n"):
        record = decode_line(line)
        if isinstance(record, UserRecord):
            turn_id = record.turn_id
        elif isinstance(record, ToolCallRecord):
            calls.add(record.call_id)
        elif isinstance(record, ToolResultRecord):
            results.add(record.call_id)
    return turn_id, calls, results


async def _killed_after(
    home: Path, project: Path, fake: FakeProviderServer, activities: int
) -> tuple[str, list[dict[str, Any]]]:
    """Run the turn, read ``activities`` activity events, hold the append lock, read on,
    kill; returns the session and every activity the client read."""
    _script(fake)
    svc = await ServiceProcess.start(home, project)
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()

    async def read_until(deadline: float, count: int | None) -> None:
        messages = svc.pending
        while count is None or len(seen) < count:
            if messages:
                message = messages.pop(0)
            else:
                try:
                    message = await svc._read(max(0.01, deadline - loop.time()))
                except TimeoutError:
                    assert count is None, "the events did not arrive"
                    return
            if message["kind"] != "event" or message["request_id"] != rid:
                continue
            assert message["event"] != "turn.terminal", "the turn ended before the kill"
            if message["event"] == "turn.activity":
                seen.append(message["payload"]["activity"])
            if count is None and loop.time() >= deadline:
                return

    try:
        await svc.initialize()
        rid, accepted = await start_turn(svc, "list the files")
        await read_until(loop.time() + 60, activities)
        lock = os.open(home / "sessions" / accepted["session_id"] / "append.lock", os.O_RDONLY)
        try:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_SH)
            await read_until(loop.time() + HOLD_SECONDS, None)
            await asyncio.to_thread(_kill_the_turns_process, svc, home)
            if svc.mode == "daemon":
                await wait_for(lambda: not status(home)["running"], 30, "the daemon to die")
            else:
                await svc.wait()
        finally:
            os.close(lock)
    finally:
        await svc.stop()
    return accepted["session_id"], seen


# Both modes for the longest run (the process killed is the service, embedded, or the
# daemon); the shorter runs once.
@pytest.mark.parametrize("activities", [3, 60, pytest.param(250, marks=pytest.mark.both_modes)])
async def test_every_activity_seen_before_a_kill_9_has_its_records(
    home: Path, project: Path, activities: int
) -> None:
    for package in range(3):
        (project / f"pkg{package}").mkdir()
        for module in range(5):
            (project / f"pkg{package}" / f"mod{module}.py").write_text("x = 1\n")
    with FakeProviderServer() as fake:
        write_settings(home, fake)
        session_id, seen = await _killed_after(home, project, fake, activities)
    turn_id, calls, results = _records(home, session_id)
    assert turn_id
    call_of = {identity("tool-call", turn_id, c): c for r in range(ROUNDS) for c in _calls(r)}
    tools = [a for a in seen if a["kind"] == "tool"]
    for activity in tools:
        assert call_of[activity["activity_id"]] in calls, activity
    requests = [a["request_sequence"] for a in seen if a["kind"] == "context"]
    for request in requests:
        earlier = {c for r in range(request - 1) for c in _calls(r)}
        assert earlier <= results, (request, sorted(earlier - results))
    assert tools or activities < CALLS  # the larger reads saw tool activity
