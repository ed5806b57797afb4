"""The daemon's ``v1_shim`` role on the wire (RFC-0002 §5), driven raw over the in-memory
transport: records are handled as they arrive, several outputs are unacknowledged at
once up to a bound, and an answer's request ID is free once its ``written`` was read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.support.inprocess import InMemoryDaemon, in_memory_daemon

from magi_code.client import Channel
from magi_code.daemon.v1_role import MAX_OUTPUTS_IN_FLIGHT, MAX_UNWRITTEN_ANSWERS
from magi_code.protocol import envelope

QUIET = 0.3  # how long "nothing more arrives" is watched for


@pytest.fixture
async def daemon(home: Path, project: Path) -> AsyncIterator[InMemoryDaemon]:
    async with in_memory_daemon(home, project) as running:
        yield running


def _record(request_id: str, method: str = "status") -> dict[str, Any]:
    payload = {"supported_protocol_versions": [1]} if method == "initialize" else {}
    return {"t": "record", "data": orjson.dumps(envelope.request(request_id, method, payload))}


async def _frames(channel: Channel, count: int) -> list[dict[str, Any]]:
    async with asyncio.timeout(20):
        return [frame for _ in range(count) if (frame := await channel.recv()) is not None]


async def _nothing_more(channel: Channel) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(QUIET):
            await channel.recv()


def _answer(frame: dict[str, Any]) -> dict[str, Any]:
    assert frame["t"] == "output" and frame.get("answers") is True, frame
    message: dict[str, Any] = orjson.loads(frame["data"])
    return message


async def test_records_are_answered_without_waiting_for_acknowledgements(
    daemon: InMemoryDaemon,
) -> None:
    channel = await daemon.channel("v1_shim")
    try:
        await channel.send(_record("init", "initialize"))
        for i in range(10):
            await channel.send(_record(f"s{i}"))
        outputs = await _frames(channel, 11)  # none acknowledged yet
        assert [_answer(f)["request_id"] for f in outputs] == ["init"] + [
            f"s{i}" for i in range(10)
        ]
        assert [f["seq"] for f in outputs] == list(range(1, 12))
        for frame in outputs:
            await channel.send({"t": "written", "seq": frame["seq"]})
        await channel.send({"t": "eof"})
        assert await _frames(channel, 1) == [{"t": "end", "status": "ok", "detail": None}]
    finally:
        await channel.close()


async def test_unacknowledged_outputs_are_bounded_and_each_ack_lets_one_more_go(
    daemon: InMemoryDaemon,
) -> None:
    assert MAX_OUTPUTS_IN_FLIGHT <= MAX_UNWRITTEN_ANSWERS
    channel = await daemon.channel("v1_shim")
    try:
        await channel.send(_record("init", "initialize"))
        for i in range(MAX_OUTPUTS_IN_FLIGHT + 10):
            await channel.send(_record(f"s{i}"))
        outputs = await _frames(channel, MAX_OUTPUTS_IN_FLIGHT)
        await _nothing_more(channel)
        await channel.send({"t": "written", "seq": outputs[0]["seq"]})
        (released,) = await _frames(channel, 1)
        assert released["seq"] == outputs[-1]["seq"] + 1
        await _nothing_more(channel)
    finally:
        await channel.close()


async def test_a_request_id_is_free_once_its_answer_is_acknowledged_not_before(
    daemon: InMemoryDaemon,
) -> None:
    channel = await daemon.channel("v1_shim")
    try:
        await channel.send(_record("init", "initialize"))
        await channel.send(_record("dup"))
        init, first = await _frames(channel, 2)
        await channel.send({"t": "written", "seq": init["seq"]})
        await channel.send(_record("dup"))  # its answer is not acknowledged yet
        (early,) = await _frames(channel, 1)
        assert _answer(early)["error"]["code"] == "duplicate_request_id"
        # The acknowledgement and the record in one write: settled before it is handled.
        await channel.send({"t": "written", "seq": first["seq"]})
        await channel.send({"t": "written", "seq": early["seq"]})
        await channel.send(_record("dup"))
        (later,) = await _frames(channel, 1)
        assert _answer(later)["request_id"] == "dup" and _answer(later)["error"] is None
    finally:
        await channel.close()


async def test_an_acknowledgement_out_of_order_is_an_output_failure(
    daemon: InMemoryDaemon,
) -> None:
    channel = await daemon.channel("v1_shim")
    try:
        await channel.send(_record("init", "initialize"))
        await channel.send(_record("s"))
        _, second = await _frames(channel, 2)
        await channel.send({"t": "written", "seq": second["seq"]})  # the first is skipped
        (end,) = await _frames(channel, 1)
        assert end == {"t": "end", "status": "output_error", "detail": None}
    finally:
        await channel.close()
