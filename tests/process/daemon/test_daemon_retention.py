"""A real daemon keeps a bounded number of finished turns; the ones it let go are still
read from their session's durable history."""

from __future__ import annotations

from pathlib import Path

from magi_code.client import Client
from magi_code.core.journal import MAX_FINISHED_TURNS
from tests.process.daemon.support import persistent
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, Reply

EXTRA = 3


async def _turn(client: Client, session_id: str | None, text: str) -> tuple[str, str]:
    """Run one turn to its end; its (session_id, turn_id)."""
    reply = await client.request(
        "turn.start", {"prompt": text, "options": {}}, session_id=session_id
    )
    assert reply["error"] is None, reply
    turn_id = reply["payload"]["turn_id"]
    async for event in client.events():
        if event["event"] == "turn.terminal" and event["payload"]["turn_id"] == turn_id:
            assert event["payload"]["status"] == "completed", event
            return reply["payload"]["session_id"], turn_id
    raise AssertionError("the connection ended before the turn did")


async def test_finished_turns_past_the_bound_leave_the_journal_but_not_the_history(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    turns = MAX_FINISHED_TURNS + EXTRA
    for i in range(turns):
        fake.enqueue(Reply(text=[f"reply {i}"]))
    client = await persistent(home, project)
    try:
        session_id: str | None = None
        ids: list[str] = []
        for i in range(turns):
            session_id, turn_id = await _turn(client, session_id, f"prompt {i}")
            ids.append(turn_id)
        assert session_id is not None
        status = dict(await client.status())
        assert status["retained_turns"] == MAX_FINISHED_TURNS
        kept = [item["turn_id"] for item in await client.snapshot()]
        assert kept == ids[EXTRA:]
        # The oldest turns: gone from the journal, answered from the session's history.
        for i, turn_id in enumerate(ids[:EXTRA]):
            answer = await client.attach(turn_id, session_id=session_id)
            assert answer["status"] == "finished", answer
            terminal = answer["events"][-1]
            assert terminal["event"] == "turn.terminal"
            assert terminal["payload"]["assistant_text"] == f"reply {i}"
    finally:
        await client.close()
