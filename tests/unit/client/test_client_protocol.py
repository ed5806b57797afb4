"""The client against a scripted daemon: protocol errors, fatal errors, typed answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from magi_code.client import (
    Client,
    DaemonError,
    DaemonUnavailable,
    DeadlineExceeded,
    Event,
    OutcomeUnknown,
    Overloaded,
)
from magi_code.protocol.frames import HEADER
from tests.unit.client.peer import connected, event, message


async def _drain(client: Client) -> tuple[list[Event], BaseException | None]:
    seen: list[Event] = []
    try:
        async for item in client.events():
            seen.append(item)
    except DaemonError as exc:
        return seen, exc
    return seen, None


async def test_an_unknown_frame_type_fails_every_pending_call_and_the_events() -> None:
    async with connected() as (client, peer):
        snapshot = asyncio.ensure_future(client.snapshot())
        attach = asyncio.ensure_future(client.attach("t-1", 3))
        request = asyncio.ensure_future(client.request("session.list"))
        await peer.expect("snapshot")
        await peer.expect("attach")
        await peer.expect("request")
        await peer.send(message(event("t-1", 1)), {"t": "turn.surprise", "id": 1})
        for call in (snapshot, attach):
            with pytest.raises(DaemonError) as failed:
                await call
            assert failed.value.code == "unknown_frame"
        with pytest.raises(OutcomeUnknown) as unknown:  # a sent request: outcome unknown
            await request
        assert unknown.value.code == "unknown_frame"
        seen, error = await _drain(client)
        assert seen == [event("t-1", 1)]  # what came before is still delivered
        assert isinstance(error, DaemonError) and error.code == "unknown_frame"
        assert await asyncio.wait_for(peer.recv(), 10) is None  # the client hung up
        with pytest.raises(DaemonError) as later:  # nothing more is sent
            await client.control("status")
        assert later.value.code == "unknown_frame"


@pytest.mark.parametrize(
    "frame",
    [{"id": 1}, {"t": 7}, {"t": "output", "seq": 0, "data": b""}, {"t": "welcome"}],
)
async def test_frames_without_a_known_type_or_for_another_role_break_the_connection(
    frame: dict[str, Any],
) -> None:
    async with connected() as (client, peer):
        await peer.send(frame)
        seen, error = await _drain(client)
        assert seen == []
        assert isinstance(error, DaemonError)
        assert error.code in ("unknown_frame", "protocol_error")
        if "t" not in frame or frame["t"] == 7:
            assert error.code == "unknown_frame"


async def test_a_fatal_error_frame_surfaces_its_code_after_what_came_before() -> None:
    async with connected() as (client, peer):
        status = asyncio.ensure_future(client.control("status"))
        await peer.expect("control")
        fatal = {"t": "error", "code": "internal_error", "message": "internal error"}
        await peer.send(
            message(event("t-1", 1)),
            {"t": "overloaded", "turn_id": "t-1", "after_sequence": 1},
            fatal,
        )
        with pytest.raises(DaemonError) as failed:
            await status
        assert failed.value.code == "internal_error"
        assert str(failed.value) == "internal error"
        seen, error = await _drain(client)
        assert seen == [event("t-1", 1), Overloaded("t-1", 1)]
        assert isinstance(error, DaemonError) and error.code == "internal_error"
        # Every later call and iteration reports the same code without sending anything.
        with pytest.raises(DaemonError) as later:
            await client.attach("t-1")
        assert later.value.code == "internal_error"
        with pytest.raises(DaemonError):
            await client.next_event()


async def test_a_clean_close_ends_the_events_and_pending_calls_are_unavailable() -> None:
    async with connected() as (client, peer):
        grant = asyncio.ensure_future(client.take_control("s-1"))
        await peer.expect("take_control")
        await peer.send(message(event("t-1", 1)))
        peer.sock.shutdown(2)
        seen, error = await _drain(client)
        assert seen == [event("t-1", 1)] and error is None
        with pytest.raises(DaemonUnavailable) as lost:
            await grant
        assert type(lost.value) is DaemonUnavailable  # take_control may be repeated


async def test_invalid_framing_from_the_daemon_is_a_framing_error() -> None:
    async with connected() as (client, peer):
        await peer.send(message(event("t-1", 1)))
        await asyncio.get_running_loop().sock_sendall(peer.sock, HEADER.pack(2**31))
        seen, error = await _drain(client)
        assert seen == [event("t-1", 1)]
        assert isinstance(error, DaemonError) and error.code == "framing_error"


async def test_the_overload_notice_is_a_typed_value() -> None:
    async with connected() as (client, peer):
        await peer.send({"t": "overloaded", "turn_id": "t-9", "after_sequence": -1})
        notice = await asyncio.wait_for(client.next_event(), 10)
        assert notice == Overloaded(turn_id="t-9", after_sequence=-1)
        assert isinstance(notice, Overloaded)
        await peer.send({"t": "overloaded", "turn_id": "t-9", "after_sequence": "4"})
        seen, error = await _drain(client)
        assert seen == [] and isinstance(error, DaemonError)
        assert error.code == "protocol_error"


async def test_a_split_attach_answer_is_joined_in_order_and_only_after_its_last_part() -> None:
    async with connected() as (client, peer):
        attach = asyncio.ensure_future(client.attach("t-1", 2, session_id="s-1"))
        sent = await peer.expect("attach")
        assert {k: sent[k] for k in ("turn_id", "after_sequence", "session_id")} == {
            "turn_id": "t-1",
            "after_sequence": 2,
            "session_id": "s-1",
        }
        fid = sent["id"]
        events = [event("t-1", n) for n in range(3, 9)]
        await peer.send(
            {
                "t": "attach_result",
                "id": fid,
                "status": "attached",
                "events": events[:2],
                "more": True,
            },
            {"t": "attach_more", "id": fid, "events": events[2:3], "more": True},
        )
        # A later call answered proves the client read both parts: attach still waits.
        status = asyncio.ensure_future(client.control("status"))
        control = await peer.expect("control")
        await peer.send({"t": "control_result", "id": control["id"], "result": {"pid": 1}})
        assert await status == {"pid": 1}
        assert not attach.done()
        await peer.send({"t": "attach_more", "id": fid, "events": events[3:], "more": False})
        result = await attach
        assert result == {"turn_id": "t-1", "status": "attached", "events": events, "failure": None}


async def test_an_attach_answer_without_more_is_complete_and_errors_carry_codes() -> None:
    async with connected() as (client, peer):
        attach = asyncio.ensure_future(client.attach("t-1"))
        sent = await peer.expect("attach")
        assert sent["after_sequence"] == -1 and "session_id" not in sent
        terminal = event("t-1", 4, "turn.terminal")
        await peer.send(
            {"t": "attach_result", "id": sent["id"], "status": "finished", "events": [terminal]}
        )
        assert (await attach)["events"] == [terminal]
        for code in ("unknown_turn", "session_busy", "invalid_request"):
            failing = asyncio.ensure_future(client.attach("t-2"))
            sent = await peer.expect("attach")
            await peer.send({"t": "attach_error", "id": sent["id"], "code": code})
            with pytest.raises(DaemonError) as failed:
                await failing
            assert failed.value.code == code


async def test_an_attach_more_before_its_result_breaks_the_connection() -> None:
    async with connected() as (client, peer):
        attach = asyncio.ensure_future(client.attach("t-1"))
        sent = await peer.expect("attach")
        await peer.send({"t": "attach_more", "id": sent["id"], "events": [], "more": False})
        with pytest.raises(DaemonError) as failed:
            await attach
        assert failed.value.code == "protocol_error"


def _item(turn_id: str) -> dict[str, Any]:
    return {
        "turn_id": turn_id,
        "session_id": "s-1",
        "project_dir": "/work/project",
        "request_id": "r-1",
        "idempotency_key": None,
        "status": "running",
        "assistant_text": "",
        "sequence": 0,
        "terminal": None,
    }


async def test_snapshot_follows_cursors_with_the_same_filters() -> None:
    async with connected() as (client, peer):
        items = [_item(f"t-{n}") for n in range(5)]
        snap = asyncio.ensure_future(
            client.snapshot(session_id="s-1", turn_ids=["t-0", "t-1"], project_dir="/work/project")
        )
        pages = [(items[:2], "c-1"), (items[2:3], "c-2"), (items[3:], None)]
        cursor = None
        for turns, next_cursor in pages:
            sent = await peer.expect("snapshot")
            assert sent.get("cursor") == cursor
            assert sent["session_id"] == "s-1" and sent["turn_ids"] == ["t-0", "t-1"]
            assert sent["project_dir"] == "/work/project"
            await peer.send(
                {
                    "t": "snapshot_result",
                    "id": sent["id"],
                    "turns": turns,
                    "next_cursor": next_cursor,
                }
            )
            cursor = next_cursor
        assert await snap == items

        paged = []

        async def pages_of() -> None:
            async for page in client.snapshot_pages():
                paged.append(page)

        reading = asyncio.ensure_future(pages_of())
        sent = await peer.expect("snapshot")
        assert set(sent) == {"t", "id"}  # no filters, no cursor
        await peer.send({"t": "snapshot_result", "id": sent["id"], "turns": items[:1]})
        await reading  # an older daemon without next_cursor: one page
        assert paged == [{"turns": items[:1], "next_cursor": None}]


async def test_snapshot_asks_for_many_turn_ids_in_groups_and_reports_invalid_requests() -> None:
    async with connected() as (client, peer):
        ids = [f"t-{n}" for n in range(300)]
        snap = asyncio.ensure_future(client.snapshot(turn_ids=ids))
        for group in (ids[:256], ids[256:]):
            sent = await peer.expect("snapshot")
            assert sent["turn_ids"] == group
            turns = [_item(group[0])]
            await peer.send(
                {"t": "snapshot_result", "id": sent["id"], "turns": turns, "next_cursor": None}
            )
        assert [t["turn_id"] for t in await snap] == ["t-0", "t-256"]
        bad = asyncio.ensure_future(client.snapshot(project_dir="relative"))
        sent = await peer.expect("snapshot")
        await peer.send({"t": "snapshot_error", "id": sent["id"], "code": "invalid_request"})
        with pytest.raises(DaemonError) as failed:
            await bad
        assert failed.value.code == "invalid_request"


async def test_take_control_and_status_return_their_answers() -> None:
    async with connected() as (client, peer):
        grant = asyncio.ensure_future(client.take_control("s-1"))
        sent = await peer.expect("take_control")
        assert sent["session_id"] == "s-1"
        turns = [{"turn_id": "t-1", "sequence": 7}]
        await peer.send(
            {"t": "control_granted", "id": sent["id"], "session_id": "s-1", "turns": turns}
        )
        assert await grant == {"session_id": "s-1", "turns": turns}
        refused = asyncio.ensure_future(client.take_control("s-2"))
        sent = await peer.expect("take_control")
        await peer.send({"t": "grant_error", "id": sent["id"], "code": "session_busy"})
        with pytest.raises(DaemonError) as busy:
            await refused
        assert busy.value.code == "session_busy"
        status = asyncio.ensure_future(client.status())
        sent = await peer.expect("control")
        assert sent["op"] == "status"
        await peer.send({"t": "control_result", "id": sent["id"], "result": {"clients": 2}})
        assert (await status)["clients"] == 2


async def test_an_answer_of_the_wrong_type_for_its_id_is_a_protocol_error() -> None:
    async with connected() as (client, peer):
        status = asyncio.ensure_future(client.control("status"))
        sent = await peer.expect("control")
        await peer.send({"t": "snapshot_result", "id": sent["id"], "turns": []})
        with pytest.raises(DaemonError) as failed:
            await status
        assert failed.value.code == "protocol_error"


async def test_request_errors_carry_their_codes() -> None:
    async with connected() as (client, peer):
        for code, kind in (
            ("deadline_exceeded", DeadlineExceeded),
            ("invalid_idempotency_key", DaemonError),
        ):
            call = asyncio.ensure_future(client.request("session.create", deadline_ms=1))
            sent = await peer.expect("request")
            rid = sent["message"]["request_id"]
            await peer.send(
                {"t": "request_error", "request_id": rid, "code": code, "message": "fixed text"}
            )
            with pytest.raises(kind) as failed:
                await call
            assert failed.value.code == code and str(failed.value) == "fixed text"


async def test_responses_go_to_their_request_and_events_to_the_stream() -> None:
    async with connected() as (client, peer):
        first = asyncio.ensure_future(client.request("session.list", request_id="a"))
        second = asyncio.ensure_future(client.request("session.list", request_id="b"))
        await peer.expect("request")
        b = await peer.expect("request")
        await peer.respond(b, {"n": "b"})
        await peer.send(message(event("t-1", 1)))
        assert (await second)["payload"] == {"n": "b"}
        assert not first.done()
        with pytest.raises(ValueError):
            await client.request("session.list", request_id="a")  # still in flight
        assert await asyncio.wait_for(client.next_event(), 10) == event("t-1", 1)
        first.cancel()


async def test_queue_add_returns_the_added_entry_and_needs_its_id() -> None:
    entry = {"entry_id": "q-1", "text": "next", "by": "cli#1", "added_at": "2026-12-05T03:00:00Z"}
    async with connected() as (client, peer):
        added = asyncio.ensure_future(client.queue_add("s-1", "next"))
        sent = await peer.expect("queue_add")
        assert (sent["session_id"], sent["text"]) == ("s-1", "next")
        answer = {"t": "queue_result", "id": sent["id"], "session_id": "s-1"}
        await peer.send({**answer, "entries": [entry], "entry_id": "q-1"})
        assert await added == entry
        # Its turn started before the answer: the entry is no longer queued.
        started = asyncio.ensure_future(client.queue_add("s-1", "then"))
        sent = await peer.expect("queue_add")
        await peer.send({**answer, "id": sent["id"], "entries": [], "entry_id": "q-2"})
        assert await started == {"entry_id": "q-2", "text": "then", "by": "", "added_at": ""}
        nameless = asyncio.ensure_future(client.queue_add("s-1", "later"))
        sent = await peer.expect("queue_add")
        await peer.send({**answer, "id": sent["id"], "entries": [entry]})
        with pytest.raises(DaemonError) as failed:
            await nameless
        assert failed.value.code == "protocol_error"
