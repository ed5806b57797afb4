"""A raw v2 ``persistent`` connection for tests: frames as sent, answers as received.

Tests that pin the wire protocol (rather than a client library's behaviour) use this over
a real socket or the in-memory transport. Every frame it receives that has a JSON
Schema — approvals (RFC-0002 §6.7, ``protocol.schema.approvals``), fork and rewind
(§6.16, ``rewind``), watching, hand-over, steering, library and queue (§6.1,
§6.9 to §6.12, ``session``) — is checked against it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from magi_code.client import Channel
from magi_code.protocol import envelope, v2
from magi_code.protocol.schema import approvals, rewind, session
from tests.support import wire_schema

Frame = dict[str, Any]
# The document each received frame type is checked against.
_SCHEMAS: dict[object, str] = {
    **dict.fromkeys(approvals.FRAMES, approvals.BUNDLE),
    **dict.fromkeys(rewind.FRAMES, rewind.BUNDLE),
    **session.BUNDLES,
}
# A call's refusal: every per-frame error answer the daemon sends.
_ERRORS = tuple(sorted(kind for kind in v2.SERVER_FRAMES if kind.endswith("_error")))


class Peer:
    """One raw v2 connection; frames read while waiting for something stay in ``seen``."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.seen: list[Frame] = []
        self._ids = 0

    @classmethod
    async def over(cls, channel: Channel, *, initialize: bool = True) -> Peer:
        peer = cls(channel)
        if initialize:
            response = await peer.request("initialize", {"supported_protocol_versions": [1]})
            assert response["error"] is None
        return peer

    async def until(self, predicate: Callable[[Frame], bool], timeout: float = 20) -> Frame:
        for i, frame in enumerate(self.seen):
            if predicate(frame):
                return self.seen.pop(i)
        async with asyncio.timeout(timeout):
            while (got := await self.channel.recv()) is not None:
                kind = got.get("t")
                if kind in _SCHEMAS:
                    wire_schema.check(_SCHEMAS[kind], got)
                if predicate(got):
                    return got
                self.seen.append(got)
        raise AssertionError("the connection ended first")

    async def send_request(
        self, method: str, payload: dict[str, Any], *, session_id: str | None = None, **extra: Any
    ) -> str:
        self._ids += 1
        rid = f"r{self._ids}"
        message = envelope.request(rid, method, payload, session_id)
        await self.channel.send({"t": "request", "message": message, **extra})
        return rid

    async def request(self, method: str, payload: dict[str, Any], **kwargs: Any) -> Frame:
        rid = await self.send_request(method, payload, **kwargs)
        frame = await self.until(
            lambda f: (
                f["t"] == "message"
                and f["message"].get("request_id") == rid
                and f["message"]["kind"] == "response"
            )
        )
        message: Frame = frame["message"]
        return message

    async def call(self, frame: Frame, answer: str) -> Frame:
        self._ids += 1
        await self.channel.send({**frame, "id": self._ids})
        fid = self._ids
        return await self.until(lambda f: f.get("id") == fid and f["t"] in (answer, *_ERRORS))

    async def turn_events(self, turn_id: str) -> list[Frame]:
        """This turn's events as live ``message`` frames, up to its terminal."""
        events: list[Frame] = []
        while not events or events[-1]["event"] != "turn.terminal":
            frame = await self.until(
                lambda f: (
                    f["t"] == "message"
                    and f["message"]["kind"] == "event"
                    and f["message"]["payload"].get("turn_id") == turn_id
                )
            )
            events.append(frame["message"])
        return events

    async def attach(
        self, turn_id: str, after: int = -1, **extra: Any
    ) -> tuple[Frame, list[Frame]]:
        """The attach answer and all its events (``attach_more`` parts joined)."""
        first = await self.call(
            {"t": "attach", "turn_id": turn_id, "after_sequence": after, **extra}, "attach_result"
        )
        events = list(first.get("events", []))
        more = first.get("more", False)
        while more:
            part = await self.until(lambda f: f["t"] == "attach_more" and f["id"] == first["id"])
            events += part["events"]
            more = part["more"]
        return first, events

    async def close(self) -> None:
        await self.channel.close()


def sequences(events: list[Frame]) -> list[int]:
    return [e["payload"]["sequence"] for e in events]
