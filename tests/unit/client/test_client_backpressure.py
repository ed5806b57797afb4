"""The event buffer is bounded: a client that takes no events stops reading the socket."""

from __future__ import annotations

import asyncio
import select

import pytest

from magi_code.client import MAX_QUEUED_EVENTS, Client, Event, Overloaded
from magi_code.protocol.frames import encode_frame
from tests.unit.client.peer import connected, event, message, until

BOUND = 8
FRAMES = 2000  # about 8 MB: far more than the socket buffers and the client's reader hold


def _frame(n: int) -> bytes:
    envelope = event("t-1", n)
    envelope["payload"]["text"] = f"{n:08d}" + "x" * 4096
    return encode_frame(message(envelope))


def _writable(sock: object) -> bool:
    _, ready, _ = select.select([], [sock], [], 0)
    return bool(ready)


async def test_a_full_buffer_stops_reading_so_the_daemon_cannot_write_more() -> None:
    async with connected(max_queued_events=BOUND) as (client, peer):
        loop = asyncio.get_running_loop()
        written = 0

        async def write_all() -> None:
            nonlocal written
            for n in range(FRAMES):
                await loop.sock_sendall(peer.sock, _frame(n))
                written += 1

        writer = asyncio.ensure_future(write_all())
        await until(lambda: client.backpressured, "the reader waits for room")
        await until(lambda: not _writable(peer.sock), "the daemon's send buffer is full")
        for _ in range(200):  # give a client that kept reading every chance to show it
            await asyncio.sleep(0)
        assert client.backpressured
        assert client.queued_events == BOUND
        assert not _writable(peer.sock)
        assert not writer.done() and written < FRAMES // 4

        # Taking events releases the backpressure; everything arrives, in order.
        taken: list[Event] = []
        while len(taken) < FRAMES:
            item = await asyncio.wait_for(client.next_event(), 20)
            assert item is not None and not isinstance(item, Overloaded)
            assert client.queued_events <= BOUND
            taken.append(item)
        await writer
        assert [e["payload"]["sequence"] for e in taken] == list(range(FRAMES))  # type: ignore[index]


async def test_answers_wait_behind_a_full_buffer_until_events_are_taken() -> None:
    async with connected(max_queued_events=2) as (client, peer):
        status = asyncio.ensure_future(client.control("status"))
        sent = await peer.expect("control")
        await peer.send(
            *(message(event("t-1", n)) for n in range(3)),
            {"t": "control_result", "id": sent["id"], "result": {"ok": True}},
        )
        await until(lambda: client.backpressured, "the reader waits for room")
        assert not status.done()  # its answer is behind the third event, unread
        assert await client.next_event() == event("t-1", 0)
        assert await status == {"ok": True}
        assert [await client.next_event() for _ in range(2)] == [event("t-1", 1), event("t-1", 2)]


async def test_the_bound_is_a_parameter_of_at_least_one() -> None:
    assert MAX_QUEUED_EVENTS == 1024  # the documented default
    async with connected() as (client, _peer):
        with pytest.raises(ValueError):
            Client(client.channel, max_queued_events=0)


async def test_a_timeout_waiting_for_an_event_loses_nothing() -> None:
    async with connected() as (client, peer):
        with pytest.raises(TimeoutError):
            await client.next_event(timeout=0.01)  # nothing was sent
        await peer.send(message(event("t-1", 0)))
        assert await client.next_event(timeout=20) == event("t-1", 0)
