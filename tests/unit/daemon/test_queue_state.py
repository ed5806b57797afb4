"""What the daemon keeps per session once its turns have ended (issue 36's memory).

Every turn's end runs the session's queue (RFC-0002 §6.12): its runner reads the durable
queue and finds it empty. The state it made for that (a lock, the runner's task) is as
good as a new one afterwards, so it must not stay for every session that ever ran a turn.
Every turn's start reads the session's grants: a session without any holds nothing.
"""

from __future__ import annotations

import asyncio

from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon
from tests.support.v2peer import Peer


async def test_sessions_whose_turns_ended_leave_no_queue_state(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    queue = daemon.server.core.queue
    assert queue is not None
    fake.set_default(Reply(text=["done"]))
    peer = await Peer.over(await daemon.channel("persistent"))
    sessions = set()
    for _ in range(12):  # each on a session of its own
        started = await peer.request("turn.start", {"prompt": "hi"})
        events = await peer.turn_events(started["payload"]["turn_id"])
        assert events[-1]["payload"]["status"] == "completed"
        sessions.add(started["payload"]["session_id"])
    await peer.close()
    assert len(sessions) == 12
    async with asyncio.timeout(10):  # the last turns' queue runners end
        while queue._sessions:
            await asyncio.sleep(0.01)


async def test_only_sessions_with_grants_hold_them(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    approvals = daemon.server.core.approvals
    fake.set_default(Reply(text=["done"]))
    peer = await Peer.over(await daemon.channel("persistent"))
    sessions = []
    for _ in range(3):
        started = await peer.request("turn.start", {"prompt": "hi"})
        await peer.turn_events(started["payload"]["turn_id"])
        sessions.append(started["payload"]["session_id"])
    assert not approvals._grants
    assert await approvals.grant_session(sessions[0], "tools", "write_file")
    # The next turn there reads the stored grant again and holds it; the others hold none.
    started = await peer.request("turn.start", {"prompt": "again"}, session_id=sessions[0])
    await peer.turn_events(started["payload"]["turn_id"])
    await peer.close()
    assert list(approvals._grants) == [sessions[0]]
    assert approvals.session_rules(sessions[0]).tools == ("write_file",)
    assert not approvals.session_rules(sessions[1])
