"""Streamed assistant text survives a kill -9 of the process running the turn.

The turn streams slowly, the test SIGKILLs the service process (embedded) or the daemon
(daemon mode) mid-stream, then a new service replays the session: the text streamed
more than one increment window before the kill is there, and nothing that was not
streamed (issue #12 item 7; increments: ``turns/streamed.py``), as one message in whole
2,048-byte parts, before and after ``session.open`` closes the dead turn (issue #31).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.turns.streamed import INCREMENT_SECONDS
from tests.process.daemon.support import exited, paths
from tests.process.turn_support import (
    conversation,
    replay_events,
    start_turn,
    whole_messages,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess

# Both modes: the process killed is the service (embedded) or the daemon.
pytestmark = pytest.mark.both_modes

CHUNKS = [f"chunk{i:02d}:" + "ab" * 8 + " " for i in range(40)]
# 5,160 bytes of 1-, 2- and 3-byte characters: three parts.
WIDE_CHUNKS = [f"chunk{i:02d}:" + "aé漢" * 20 + " " for i in range(40)]
CHUNK_DELAY = 0.05
# Where only the text after the stream stalled matters, not when each part was durable.
FAST_CHUNK_DELAY = 0.005
# One increment window plus generous room for the append in flight on a loaded machine.
SLACK_SECONDS = INCREMENT_SECONDS + 0.75


class DeltaClock:
    """When the test read each assistant delta of one request."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.seen: list[tuple[float, str]] = []

    def __call__(self, message: dict[str, Any]) -> bool:
        if (
            message["kind"] == "event"
            and message["request_id"] == self.request_id
            and message["event"] == "turn.assistant_delta"
        ):
            self.seen.append((time.monotonic(), message["payload"]["text"]))
        return False

    def text(self, before: float | None = None) -> str:
        return "".join(t for at, t in self.seen if before is None or at <= before)


async def _read_deltas(svc: ServiceProcess, clock: DeltaClock, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while len(clock.seen) < count:
        assert loop.time() < deadline, "the deltas did not arrive"
        message = await svc._read(max(0.1, deadline - loop.time()))
        clock(message)


def _kill_the_turns_process(svc: ServiceProcess, home: Path) -> int:
    """SIGKILL the process running the turn; its pid."""
    if svc.mode == "daemon":
        pid = orjson.loads(paths(home).info.read_bytes())["pid"]
        assert isinstance(pid, int)
    else:
        pid = svc.proc.pid
    os.kill(pid, signal.SIGKILL)
    return pid


async def _replayed_assistant_text(home: Path, project: Path, session_id: str) -> str:
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        events, _ = await replay_events(svc, session_id)
    finally:
        await svc.stop()
    items = conversation(whole_messages(events))
    # No terminal was written (nothing took the session's lease): the user message, and
    # the reply's increments as one message.
    assert [i[:2] for i in items] == [("message", "user"), ("message", "assistant")], items
    return items[1][2]


async def _turn_killed_after(
    home: Path,
    project: Path,
    fake: FakeProviderServer,
    deltas: int,
    *,
    settle: float = 0.0,
    chunks: list[str] = CHUNKS,
    chunk_delay: float = CHUNK_DELAY,
) -> tuple[DeltaClock, float, str]:
    write_settings(home, fake)
    fake.enqueue(
        Reply(text=chunks, chunk_delay=chunk_delay, ending="stall", after_chunks=len(chunks))
    )
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        rid, accepted = await start_turn(svc, "stream slowly")
        clock = DeltaClock(rid)
        for message in list(svc.pending):
            clock(message)
        await _read_deltas(svc, clock, deltas)
        if settle:
            await asyncio.sleep(settle)
        killed_at = time.monotonic()
        pid = await asyncio.to_thread(_kill_the_turns_process, svc, home)
        if svc.mode == "daemon":
            await exited(pid, 30)  # its lifetime lock went with it
        else:
            await svc.wait()
    finally:
        await svc.stop()
    return clock, killed_at, accepted["session_id"]


async def test_text_streamed_before_a_kill_9_mid_stream_is_replayed(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    clock, killed_at, session_id = await _turn_killed_after(home, project, fake, 36)
    replayed = await _replayed_assistant_text(home, project, session_id)
    durable_by_then = clock.text(before=killed_at - SLACK_SECONDS)
    assert len(durable_by_then) > len(CHUNKS[0]) * 10  # the check has substance
    # The process may have streamed a little past what the test had read when it died;
    # replay holds a prefix of the stream, at least what was read a window before.
    assert "".join(CHUNKS).startswith(replayed)
    assert replayed.startswith(durable_by_then), (len(replayed), len(durable_by_then))


async def test_all_text_of_a_stalled_stream_is_replayed_after_a_kill_9(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    # Every chunk was streamed, then the provider stalls: once a window has passed, the
    # whole text is durable although the turn never ended.
    clock, _, session_id = await _turn_killed_after(
        home, project, fake, len(CHUNKS), settle=SLACK_SECONDS, chunk_delay=FAST_CHUNK_DELAY
    )
    assert clock.text() == "".join(CHUNKS)
    assert await _replayed_assistant_text(home, project, session_id) == "".join(CHUNKS)


async def test_a_reply_cut_by_a_kill_9_replays_as_one_message_and_open_closes_its_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    clock, _, session_id = await _turn_killed_after(
        home,
        project,
        fake,
        len(WIDE_CHUNKS),
        settle=SLACK_SECONDS,
        chunks=WIDE_CHUNKS,
        chunk_delay=FAST_CHUNK_DELAY,
    )
    text = "".join(WIDE_CHUNKS)
    assert clock.text() == text
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        events, cursor = await replay_events(svc, session_id)
        cut = [("message", "user", "stream slowly"), ("message", "assistant", text)]
        assert conversation(whole_messages(events)) == cut
        # Taking the session's lease closes the turn its dead process left open.
        opened = await svc.request("session.open", {}, session_id=session_id)
        assert opened["error"] is None, opened
        after_open, _ = await replay_events(svc, session_id)
        assert conversation(whole_messages(after_open)) == [*cut, ("terminal", "failed")]
        assert after_open[: len(events)] == events  # the message is as it was
        rest, _ = await replay_events(svc, session_id, after=cursor)
        assert rest == after_open[len(events) :]
    finally:
        await svc.stop()
