"""Session attachments across real service processes: leases, crashes, restarts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from magi_code.protocol.limits import MAX_SESSION_LIST_SCAN_ENTRIES
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess, running_service

# Both modes: leases between processes (embedded) and between shims of one daemon.
pytestmark = pytest.mark.both_modes


async def _create(service: ServiceProcess) -> str:
    response = await service.request("session.create")
    assert response["error"] is None, response
    session_id: str = response["payload"]["session_id"]
    return session_id


async def test_second_process_cannot_attach_a_held_session(home: Path, project: Path) -> None:
    async with running_service(home, project) as first, running_service(home, project) as second:
        session_id = await _create(first)
        opened = await second.request("session.open", session_id=session_id)
        assert opened["error"]["code"] == "session_busy"
        turn = await second.request("turn.start", {"prompt": "hi"}, session_id=session_id)
        assert turn["error"]["code"] == "session_busy"
        # Replay needs no lease; close never releases another process's lease.
        replay = await second.request("session.replay", session_id=session_id)
        assert replay["error"] is None
        closed = await second.request("session.close", session_id=session_id)
        assert closed["payload"]["status"] == "closed"
        assert (await second.request("session.open", session_id=session_id))["error"]["code"] == (
            "session_busy"
        )
        await first.request("session.close", session_id=session_id)
        reopened = await second.request("session.open", session_id=session_id)
        assert reopened["payload"] == {"session_id": session_id, "status": "open"}, reopened


def fill_sessions_directory(home: Path, entries: int) -> None:
    """``entries`` more directory entries in ``$MC_HOME/sessions`` that are not sessions
    (hard links of one file: cheap)."""
    root = home / "sessions"
    (root / "junk").write_bytes(b"")
    for index in range(entries - 1):
        os.link(root / "junk", root / f"junk{index}")


async def test_session_list_past_the_scan_budget_is_limit_exceeded(
    home: Path, project: Path
) -> None:
    """The v1 contract: past its 20,000-entry scan budget a list request fails as a
    whole, at every position, rather than returning an arbitrary partial page."""
    async with running_service(home, project) as service:
        session_id = await _create(service)
        fill_sessions_directory(home, MAX_SESSION_LIST_SCAN_ENTRIES - 1)
        at_budget = await service.request("session.list")
        assert at_budget["payload"]["sessions"][0]["session_id"] == session_id
        assert at_budget["payload"]["incomplete"] is False
        os.link(home / "sessions" / "junk", home / "sessions" / "one-more")
        for payload in ({}, {"after": session_id, "limit": 1}):
            over = await service.request("session.list", payload)
            assert over["payload"] is None
            assert over["error"] == {
                "code": "limit_exceeded",
                "message": "A protocol limit was exceeded.",
            }
        # Only the listing is refused: the session itself still works.
        replay = await service.request("session.replay", session_id=session_id)
        assert replay["error"] is None


async def test_killed_holder_does_not_block_the_session(home: Path, project: Path) -> None:
    holder = await ServiceProcess.start(home, project)
    try:
        await holder.initialize()
        session_id = await _create(holder)
        holder.proc.kill()
        await holder.proc.wait()
    finally:
        await holder.stop()
    async with running_service(home, project) as other:
        opened = await other.request("session.open", session_id=session_id)
        assert opened["payload"] == {"session_id": session_id, "status": "open"}


async def test_attachment_limit_is_sixteen(home: Path, project: Path) -> None:
    async with running_service(home, project) as service:
        for _ in range(16):
            await _create(service)
        over = await service.request("session.create")
        assert over["error"]["code"] == "limit_exceeded"
        listing = await service.request("session.list")
        assert len(listing["payload"]["sessions"]) == 16


async def test_replay_cursor_survives_restart_and_appends(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        provider = {"api": "openai-chat", "base_url": fake.base_url + "/v1"}
        settings = {"provider": "local", "model": "m1", "providers": {"local": provider}}
        (home / "settings.json").write_text(json.dumps(settings))
        fake.enqueue(Reply(text=["first answer"]), Reply(text=["second answer"]))
        async with running_service(home, project) as service:
            started = await service.request("turn.start", {"prompt": "one"})
            session_id = started["payload"]["session_id"]
            await service.events_until_terminal(started["request_id"])
            page = await service.request("session.replay", session_id=session_id)
            saved = page["payload"]["next_cursor"]
            assert [e["kind"] for e in page["payload"]["events"]] == [
                "message",
                "message",
                "terminal",
            ]
        async with running_service(home, project) as restarted:
            again = await restarted.request(
                "session.replay", {"after": saved}, session_id=session_id
            )
            assert again["payload"]["events"] == []
            assert again["payload"]["resync_required"] is False
            started = await restarted.request(
                "turn.start", {"prompt": "two"}, session_id=session_id
            )
            assert started["error"] is None
            await restarted.events_until_terminal(started["request_id"])
            newer = await restarted.request(
                "session.replay", {"after": saved}, session_id=session_id
            )
            texts = [e.get("text") for e in newer["payload"]["events"]]
            assert texts == ["two", "second answer", None]
            assert newer["payload"]["next_cursor"] == newer["payload"]["snapshot_cursor"]


async def test_close_during_a_turn_is_closing_until_the_terminal(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        provider = {"api": "openai-chat", "base_url": fake.base_url + "/v1"}
        settings = {"provider": "local", "model": "m1", "providers": {"local": provider}}
        (home / "settings.json").write_text(json.dumps(settings))
        fake.enqueue(Reply(text=["partial "], ending="stall"))
        async with running_service(home, project) as service:
            session_id = await _create(service)
            turn = await service.request("turn.start", {"prompt": "wait"}, session_id=session_id)
            delta = await service.recv()
            while delta["event"] != "turn.assistant_delta":
                delta = await service.recv()
            first = await service.request("session.close", session_id=session_id)
            assert first["payload"] == {"session_id": session_id, "status": "closing"}
            second = await service.request("session.close", session_id=session_id)
            if second["payload"]["status"] != "closing":
                # The cancelled turn already ended (its terminal was written first).
                assert second["payload"]["status"] == "closed"
                assert any(m.get("event") == "turn.terminal" for m in service.pending)
            reopen = await service.request("session.open", session_id=session_id)
            if reopen["error"] is not None:
                assert reopen["error"]["code"] == "session_busy"  # still closing
            else:
                # The cancelled turn ended, freeing the session, before the open ran: its
                # terminal was written first.
                assert any(m.get("event") == "turn.terminal" for m in service.pending)
            events = await service.events_until_terminal(turn["request_id"])
            terminal = events[-1]["payload"]
            assert terminal["status"] == "cancelled"
            assert terminal["assistant_text"] == "partial "
            closed = await service.request("session.close", session_id=session_id)
            assert closed["payload"]["status"] == "closed"
            replay = await service.request("session.replay", session_id=session_id)
            items = [
                (e["kind"], e.get("text"), e.get("status")) for e in replay["payload"]["events"]
            ]
            assert items == [
                ("message", "wait", None),
                ("message", "partial ", None),
                ("terminal", None, "cancelled"),
            ]
