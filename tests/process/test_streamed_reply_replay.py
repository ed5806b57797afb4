"""A reply made durable in increments while it streamed replays as one message: its whole
text in parts of at most 2,048 UTF-8 bytes, ``part`` from 0, no empty part (v1 contract,
"Durable replay"; issue #31). Slow, cancelled and crash-cut replies (the last in
``test_streamed_text_durability.py``); both service modes, every record checked against
the strict schemas by ``ServiceProcess``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.process.turn_support import (
    conversation,
    replay_events,
    start_turn,
    whole_messages,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess, running_service

# Both modes: streamed text is settled by the embedded service or by the daemon.
pytestmark = pytest.mark.both_modes

# Characters of 1, 2 and 3 UTF-8 bytes, so part ends fall inside characters' reach.
SLOW_CHUNKS = [f"{i:02d}" + "aé漢" * 139 + " " for i in range(7)]  # 837 bytes each
TICKS = [f"tick{i:02d} " for i in range(10)]


def assistant_records(home: Path, session_id: str, turn_id: str) -> list[dict[str, Any]]:
    """The turn's ``assistant`` records (only to show the reply was made durable in
    increments: clients never read these files)."""
    lines = (home / "sessions" / session_id / "history.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    return [r for r in records if r["type"] == "assistant" and r["turn_id"] == turn_id]


async def replayed_until(
    svc: ServiceProcess, session_id: str, done: Callable[[str], bool]
) -> tuple[list[dict[str, Any]], str]:
    """Replay (checked whole) until the assistant text it shows satisfies ``done``; the
    events and the cursor after them."""
    async with asyncio.timeout(30):
        while True:
            events, cursor = await replay_events(svc, session_id)
            replies = [i for i in whole_messages(events) if i.get("role") == "assistant"]
            assert len(replies) <= 1, replies
            if replies and done(replies[0]["text"]):
                return events, cursor
            await asyncio.sleep(0.05)


async def test_a_slowly_streamed_reply_replays_as_one_message_in_whole_parts(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=SLOW_CHUNKS, chunk_delay=0.3))
    answer = "".join(SLOW_CHUNKS)
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "stream slowly")
        session_id = accepted["session_id"]
        terminal = (await svc.events_until_terminal(rid))[-1]["payload"]
        assert (terminal["status"], terminal["assistant_text"]) == ("completed", answer)
        increments = assistant_records(home, session_id, accepted["turn_id"])
        assert sum(1 for r in increments if r.get("continued")) >= 2, increments
        events, _ = await replay_events(svc, session_id)
        assert conversation(whole_messages(events)) == [
            ("message", "user", "stream slowly"),
            ("message", "assistant", answer),
            ("terminal", "completed"),
        ]
        replies = [e for e in events if e.get("role") == "assistant"]
        assert [e["part"] for e in replies] == [0, 1, 2]  # 5,859 bytes
        # One item a page, the parts span pages and come out the same.
        paged, _ = await replay_events(svc, session_id, limit=1)
        assert [{k: v for k, v in e.items() if k != "cursor"} for e in paged] == [
            {k: v for k, v in e.items() if k != "cursor"} for e in events
        ]


async def test_a_reply_cancelled_mid_stream_replays_as_one_message(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=TICKS, chunk_delay=0.4, ending="stall", after_chunks=len(TICKS)))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "tick")
        session_id = accepted["session_id"]
        # Two increments are durable: mid-stream replay already shows one whole message.
        streaming, cursor = await replayed_until(
            svc, session_id, lambda text: text.startswith("tick00 tick01 ")
        )
        cancel = await svc.request("turn.cancel", {"turn_id": accepted["turn_id"]})
        assert cancel["error"] is None, cancel
        terminal = (await svc.events_until_terminal(rid))[-1]["payload"]
        assert terminal["status"] == "cancelled"
        text = terminal["assistant_text"]
        assert text.startswith("tick00 tick01 ") and "".join(TICKS).startswith(text)
        events, _ = await replay_events(svc, session_id)
        assert conversation(whole_messages(events)) == [
            ("message", "user", "tick"),
            ("message", "assistant", text),
            ("terminal", "cancelled"),
        ]
        reply = [e for e in events if e.get("role") == "assistant"]
        assert [(e["part"], e["last_part"]) for e in reply] == [(0, True)]
        # The cursor saved mid-stream: the part it names grew, so the client replays
        # again (never a duplicate or a gap), or it did not, and only the rest follows.
        response = await svc.request("session.replay", {"after": cursor}, session_id=session_id)
        page = response["payload"]
        if page["resync_required"]:
            assert page["events"] == [] and text != streaming[-1]["text"]
        else:
            assert text == streaming[-1]["text"]
            assert page["events"] == events[len(streaming) :]
