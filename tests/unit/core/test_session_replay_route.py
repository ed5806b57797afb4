"""``session.replay`` in the daemon's core (shim bridging, v1 route, real store files):
every page is read in a worker thread, and together they are the same projection the
store replays by itself."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from magi_code.protocol import envelope
from magi_code.sessions.store import SessionStore
from tests.support.inprocess import V1Service, in_memory_daemon

ANSWER = "An answer long enough to be split into parts across replay pages. " * 90


def replay_all(store: SessionStore, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = None
    while True:
        page = store.replay(session_id, after, 4)
        events += page["events"]
        after = page["next_cursor"]
        if not page["truncated"]:
            return events


async def test_pages_are_read_in_a_worker_thread_and_equal_the_stores_replay(
    home: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(home / "sessions")
    session_id = store.create()
    with store.acquire_writer_lease(session_id) as lease:
        for n in range(6):
            lease.append({"type": "user", "turn_id": f"t{n}", "text": f"question {n}"})
            lease.append({"type": "assistant", "turn_id": f"t{n}", "text": ANSWER})
            terminal = {"type": "terminal", "turn_id": f"t{n}", "status": "completed"}
            lease.append({**terminal, "assistant_text": ANSWER})
    expected = replay_all(store, session_id)

    on_main_thread: list[bool] = []
    replay = SessionStore.replay

    def spied(self: SessionStore, *args: object) -> dict[str, object]:
        on_main_thread.append(threading.current_thread() is threading.main_thread())
        return replay(self, *args)

    monkeypatch.setattr(SessionStore, "replay", spied)
    async with in_memory_daemon(home, project) as daemon:
        service = await V1Service.start(daemon)
        try:
            await service.send(
                envelope.request("i", "initialize", {"supported_protocol_versions": [1]})
            )
            assert (await service.recv())["error"] is None
            events: list[dict[str, Any]] = []
            after = None
            pages = 0
            while True:
                request = envelope.request(
                    f"r{pages}", "session.replay", {"after": after, "limit": 4}, session_id
                )
                await service.send(request)
                response = await service.recv()
                assert response["request_id"] == f"r{pages}" and response["error"] is None
                page = response["payload"]
                events += page["events"]
                pages += 1
                after = page["next_cursor"]
                if not page["truncated"]:
                    break
        finally:
            await service.stop()
    assert events == expected and pages > 5
    assert on_main_thread == [False] * pages  # never on the event loop
