"""Clients that send much and read little (RFC-0002 §2.1).

A persistent client that leaves its answers unread is dropped after the client timeout,
whether or not it keeps sending: the stall is timed on the connection's output, not when
the daemon next takes one of its frames. And one client's queued frames do not hold the
daemon's loop from the others.

The in-memory transport's write buffer is everything the client has not read, so these
tests pin the rule without a kernel buffer in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon
from tests.support.v2peer import Peer

from magi_code.client.channel import launch_of
from magi_code.daemon import memory
from magi_code.daemon.connection import PeerConnection
from magi_code.daemon.outbound import DEFAULT_LIMIT_BYTES
from magi_code.protocol.frames import FrameDecoder, encode_frame
from magi_code.protocol.v2 import hello

LIMIT = 64 * 1024  # the outbound limit
TIMEOUT = 0.5  # the client timeout; only a failure bound below depends on time


def _only_client(daemon: InMemoryDaemon) -> PeerConnection:
    (peer,) = [p for p in daemon.server.peers if p.role == "persistent"]
    return peer


async def _until(predicate: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(20):  # a failure bound, not a measurement
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_client_that_stops_sending_below_the_limit_and_never_reads_is_dropped(
    daemon: InMemoryDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    daemon.server.outbound_limit = LIMIT
    daemon.server.client_timeout = TIMEOUT
    channel = await daemon.channel("persistent")
    peer = _only_client(daemon)
    sent = 0
    # Status answers, some of them unread but below the outbound limit, then silence.
    while peer.transport.get_write_buffer_size() <= LIMIT // 4:
        await channel.send({"t": "control", "id": sent, "op": "status"})
        sent += 1
        await asyncio.sleep(0)
    assert peer.writable.is_set(), "the flood was meant to stay below the outbound limit"
    with caplog.at_level(logging.WARNING, "magi_code.daemon"):
        await _until(lambda: daemon.server.clients() == 0, "the stalled client to go")
    assert "closing a connection code=client_stalled" in caplog.text
    answers = []
    while (frame := await channel.recv()) is not None:
        answers.append(frame)
    assert [(f["t"], f["id"]) for f in answers] == [("control_result", i) for i in range(sent)]
    await channel.close()


async def test_a_client_whose_turn_filled_its_queue_while_it_sent_nothing_is_dropped(
    daemon: InMemoryDaemon, fake: FakeProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    daemon.server.outbound_limit = 4096
    daemon.server.client_timeout = TIMEOUT
    fake.enqueue(Reply(text=[f"{i:04d}" * 16 for i in range(200)], chunk_delay=0.001))
    slow = await Peer.over(await daemon.channel("persistent"))
    started = await slow.request("turn.start", {"prompt": "flood"})
    turn_id = started["payload"]["turn_id"]
    # It reads nothing more and sends nothing: the role waits for input meanwhile.
    with caplog.at_level(logging.WARNING, "magi_code.daemon"):
        await _until(lambda: daemon.server.clients() == 0, "the stalled client to go")
    assert "closing a connection code=client_stalled" in caplog.text
    # The turn ran on, detached, to its end.
    await _until(lambda: daemon.server.core.counts()["active_turns"] == 0, "the turn to end")
    daemon.server.outbound_limit = DEFAULT_LIMIT_BYTES
    reader = await Peer.over(await daemon.channel("persistent"))
    answer, events = await reader.attach(turn_id)
    assert answer["status"] == "finished"
    assert events[-1]["event"] == "turn.terminal"
    assert events[-1]["payload"]["status"] == "completed"
    await reader.close()
    await slow.close()


async def test_one_clients_queued_frames_do_not_hold_the_loop_from_another_client(
    daemon: InMemoryDaemon,
) -> None:
    control = await daemon.channel("control")
    reader, writer = memory.connect(daemon.server)
    queued = 48  # within the inbox's bound: all of them are queued at once
    statuses = [encode_frame({"t": "control", "id": i, "op": "status"}) for i in range(queued)]
    writer.write(encode_frame(hello("persistent", launch_of(daemon.ctx), "t", "0")))
    await _until(lambda: bool(reader.buffer), "the welcome")  # its role waits for frames
    # Both arrive in the same loop step, this client's frames first.
    writer.write(b"".join(statuses))
    await control.send({"t": "control", "id": "other", "op": "status"})
    answer = await control.recv()
    assert answer is not None and answer["id"] == "other"
    answered = [f for f in FrameDecoder().feed(bytes(reader.buffer)) if f["t"] != "welcome"]
    assert len(answered) < queued, "the other client waited for every queued frame"
    await control.close()
    writer.close()
