"""turn.start carries an idempotency key; a lost answer is OutcomeUnknown and resumable."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from magi_code.client import DaemonUnavailable, OutcomeUnknown
from tests.unit.client.peer import connected, event, message

KEY = re.compile(r"[A-Za-z0-9\-_.:]{1,64}")


async def _lost_turn_start(**options: Any) -> tuple[OutcomeUnknown, dict[str, Any]]:
    """Send turn.start, let the daemon read it and hang up; the error and what was sent."""
    async with connected() as (client, peer):
        start = asyncio.ensure_future(client.request("turn.start", {"prompt": "hi"}, **options))
        sent = await peer.expect("request")
        peer.sock.shutdown(2)
        with pytest.raises(OutcomeUnknown) as lost:
            await start
        return lost.value, sent


async def test_turn_start_sends_a_fresh_key_and_a_lost_answer_is_outcome_unknown() -> None:
    first, sent = await _lost_turn_start(session_id="s-1")
    key = sent["idempotency_key"]
    assert isinstance(key, str) and KEY.fullmatch(key)
    assert isinstance(first, DaemonUnavailable) and type(first) is OutcomeUnknown
    assert first.idempotency_key == key
    assert first.method == "turn.start"
    assert first.payload == {"prompt": "hi"}
    assert first.session_id == "s-1"
    assert first.request_id == sent["message"]["request_id"]
    assert first.code is None
    second, again = await _lost_turn_start()
    assert again["idempotency_key"] != key  # fresh per request
    assert second.session_id is None


async def test_a_given_key_is_sent_as_is_and_other_methods_send_none() -> None:
    _, sent = await _lost_turn_start(idempotency_key="my:key-1")
    assert sent["idempotency_key"] == "my:key-1"
    async with connected() as (client, peer):
        listing = asyncio.ensure_future(client.request("session.list"))
        sent = await peer.expect("request")
        assert "idempotency_key" not in sent
        await peer.respond(sent, {"sessions": []})
        assert (await listing)["payload"] == {"sessions": []}


async def test_nothing_is_sent_on_an_ended_connection_so_it_is_plainly_unavailable() -> None:
    async with connected() as (client, peer):
        peer.sock.shutdown(2)
        assert await client.next_event() is None  # the client saw the end
        with pytest.raises(DaemonUnavailable) as refused:
            await client.request("turn.start", {"prompt": "hi"})
        assert type(refused.value) is DaemonUnavailable


async def test_a_fatal_error_while_turn_start_waits_is_outcome_unknown_with_its_code() -> None:
    async with connected() as (client, peer):
        start = asyncio.ensure_future(client.request("turn.start", {"prompt": "hi"}))
        await peer.expect("request")
        await peer.send({"t": "error", "code": "internal_error", "message": "internal error"})
        with pytest.raises(OutcomeUnknown) as lost:
            await start
        assert lost.value.code == "internal_error" and lost.value.idempotency_key


async def test_resume_turn_resends_the_same_start_and_attaches_from_the_start() -> None:
    lost, original = await _lost_turn_start(session_id="s-1")
    async with connected() as (client, peer):
        resume = asyncio.ensure_future(client.resume_turn(lost))
        sent = await peer.expect("request")
        assert sent["idempotency_key"] == original["idempotency_key"]
        request, first = sent["message"], original["message"]
        assert request["method"] == "turn.start"
        assert request["payload"] == first["payload"] == {"prompt": "hi"}
        assert request["session_id"] == "s-1"
        # The daemon answers with the original acceptance (same turn and session).
        await peer.respond(sent, {"turn_id": "t-1", "session_id": "s-1", "status": "accepted"})
        attach = await peer.expect("attach")
        assert attach["turn_id"] == "t-1"
        assert attach["after_sequence"] == -1
        assert attach["session_id"] == "s-1"
        events = [
            event("t-1", 0, "turn.started"),
            event("t-1", 1),
            event("t-1", 2, "turn.terminal"),
        ]
        await peer.send(
            {"t": "attach_result", "id": attach["id"], "status": "finished", "events": events}
        )
        response, attached = await resume
        assert response["payload"] == {"turn_id": "t-1", "session_id": "s-1", "status": "accepted"}
        assert attached == {
            "turn_id": "t-1",
            "status": "finished",
            "events": events,
            "failure": None,  # a daemon that sends no label
        }


async def test_resume_turn_returns_the_original_error_without_attaching() -> None:
    lost, _ = await _lost_turn_start()
    async with connected() as (client, peer):
        resume = asyncio.ensure_future(client.resume_turn(lost))
        sent = await peer.expect("request")
        assert "session_id" not in sent["message"]
        request = sent["message"]
        error = {"code": "session_busy", "message": "busy"}
        await peer.send(
            message(
                {
                    "protocol_version": 1,
                    "kind": "response",
                    "request_id": request["request_id"],
                    "session_id": None,
                    "method": "turn.start",
                    "payload": None,
                    "error": error,
                }
            )
        )
        response, attached = await resume
        assert response["error"] == error and attached is None
        await client.close()
        assert await asyncio.wait_for(peer.recv(), 10) is None  # no attach was sent


async def test_only_a_keyed_turn_start_can_be_resumed() -> None:
    async with connected() as (client, peer):
        listing = asyncio.ensure_future(client.request("session.list"))
        await peer.expect("request")
        peer.sock.shutdown(2)
        with pytest.raises(OutcomeUnknown) as lost:  # any sent request: outcome unknown
            await listing
        assert lost.value.idempotency_key is None
        with pytest.raises(ValueError):
            await client.resume_turn(lost.value)
