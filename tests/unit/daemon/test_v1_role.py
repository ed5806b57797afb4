"""The daemon's ``v1_shim`` role on the wire (RFC-0002 §5), driven raw over the in-memory
transport: a record is handled only once the answer before it was acknowledged, an
answer's request ID is free once its ``written`` was read, an output failure leaves the
records behind it unhandled, and a record frame is held to the v1 record bound."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from tests.support.inprocess import InMemoryDaemon
from tests.support.v2peer import Peer

from magi_code.client import Channel
from magi_code.protocol import envelope
from magi_code.protocol.limits import MAX_RECORD_BYTES

QUIET = 0.3  # how long "nothing more arrives" is watched for


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


async def _initialized(daemon: InMemoryDaemon) -> Channel:
    channel = await daemon.channel("v1_shim")
    await channel.send(_record("init", "initialize"))
    (init,) = await _frames(channel, 1)
    assert _answer(init)["error"] is None
    await channel.send({"t": "written", "seq": init["seq"]})
    return channel


async def _sessions(daemon: InMemoryDaemon) -> list[Any]:
    peer = await Peer.over(await daemon.channel("persistent"))
    try:
        listed = await peer.request("session.list", {})
        sessions: list[Any] = listed["payload"]["sessions"]
        return sessions
    finally:
        await peer.close()


async def test_a_record_is_handled_only_once_the_answer_before_it_is_acknowledged(
    daemon: InMemoryDaemon,
) -> None:
    channel = await daemon.channel("v1_shim")
    try:
        await channel.send(_record("init", "initialize"))
        for i in range(3):
            await channel.send(_record(f"s{i}"))
        seen: list[str] = []
        for index in range(4):
            (output,) = await _frames(channel, 1)
            seen.append(_answer(output)["request_id"])
            if index < 2:  # after initialize's answer and after a request's: the same after each
                await _nothing_more(channel)  # the next record waits for this acknowledgement
            await channel.send({"t": "written", "seq": output["seq"]})
        assert seen == ["init", "s0", "s1", "s2"]
        await channel.send({"t": "eof"})
        assert await _frames(channel, 1) == [{"t": "end", "status": "ok", "detail": None}]
    finally:
        await channel.close()


async def test_an_output_failure_leaves_the_records_behind_it_unhandled(
    daemon: InMemoryDaemon,
) -> None:
    channel = await _initialized(daemon)
    try:
        await channel.send(_record("s"))
        await channel.send(_record("c", "session.create"))
        await channel.send(_record("l", "session.list"))
        (output,) = await _frames(channel, 1)
        assert _answer(output)["request_id"] == "s"
        await channel.send({"t": "output_failed"})
        (end,) = await _frames(channel, 1)
        assert end == {"t": "end", "status": "output_error", "detail": None}
    finally:
        await channel.close()
    assert await _sessions(daemon) == []


async def test_a_request_id_is_free_once_its_answer_is_acknowledged_not_before(
    daemon: InMemoryDaemon,
) -> None:
    channel = await _initialized(daemon)
    try:
        # A worker answers ``config.get``: the daemon says ``next`` and goes on, and the
        # ID stays reserved until the shim acknowledges that answer.
        await channel.send(_record("dup", "config.get"))
        await channel.send(_record("dup"))
        frames = await _frames(channel, 3)
        assert frames[0] == {"t": "next"}
        outputs = [f for f in frames if f["t"] == "output"]
        answers = {orjson.loads(f["data"])["method"]: f for f in outputs}
        assert orjson.loads(answers["config.get"]["data"])["error"] is None
        early = _answer(answers["status"])
        assert early["request_id"] == "dup"
        assert early["error"]["code"] == "duplicate_request_id"
        # The acknowledgements and the record in one read: settled before it is handled.
        for output in outputs:
            await channel.send({"t": "written", "seq": output["seq"]})
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
        (first,) = await _frames(channel, 1)
        await channel.send({"t": "written", "seq": first["seq"] + 1})  # not the one sent
        (end,) = await _frames(channel, 1)
        assert end == {"t": "end", "status": "output_error", "detail": None}
    finally:
        await channel.close()


async def test_a_record_frame_is_held_to_the_v1_record_bound(daemon: InMemoryDaemon) -> None:
    channel = await _initialized(daemon)
    try:
        body = orjson.dumps(envelope.request("fits", "status", {}))
        # The bound counts the newline the shim strips: one byte less fits exactly.
        padded = body[:-1] + b" " * (MAX_RECORD_BYTES - len(body) - 1) + b"}"
        for data in (padded, padded + b" ", b" " * (MAX_RECORD_BYTES * 8)):
            await channel.send({"t": "record", "data": data})
            (output,) = await _frames(channel, 1)
            await channel.send({"t": "written", "seq": output["seq"]})
            answer = _answer(output)
            if data is padded:
                assert answer["request_id"] == "fits" and answer["error"] is None
            else:
                assert answer["request_id"] is None
                assert answer["error"]["code"] == "record_too_large"
        await channel.send(_record("after"))
        (after,) = await _frames(channel, 1)
        assert _answer(after)["error"] is None
    finally:
        await channel.close()
