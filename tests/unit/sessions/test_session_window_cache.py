"""The store's cache of parsed replay windows is bounded by count and by the history
bytes it covers; a session whose window was evicted is read again from its file."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.sessions.test_session_store import replay_all, turn

from magi_code.sessions.store import SessionStore, _WindowCache


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def _filled(store: SessionStore, answer: str) -> str:
    session = store.create()
    lease = store.acquire_writer_lease(session)
    try:
        turn(lease, "t1", "question", answer)
    finally:
        lease.release()
    return session


def _answer(store: SessionStore, session: str) -> str:
    events = replay_all(store, session)
    return "".join(str(e["text"]) for e in events if e.get("role") == "assistant")


def _cached(store: SessionStore) -> list[str]:
    return list(store._cache._entries)


def test_more_sessions_than_the_count_bound_keep_the_most_recent(store: SessionStore) -> None:
    sessions = [_filled(store, f"answer {i}") for i in range(_WindowCache.CAPACITY + 3)]
    for session in sessions:
        replay_all(store, session)
    assert _cached(store) == sessions[3:]
    # Evicted, and read again from disk: the same events as from the cache.
    assert _answer(store, sessions[0]) == "answer 0"
    assert _cached(store)[-1] == sessions[0]


def test_windows_past_the_byte_bound_go_oldest_first(store: SessionStore) -> None:
    # Each history holds about a third of the byte bound (the answer twice: as the
    # assistant record and in the terminal).
    answer = "b" * (_WindowCache.CAPACITY_BYTES // 6)
    sessions = [_filled(store, answer) for _ in range(4)]
    for session in sessions:
        replay_all(store, session)
    assert _cached(store) == sessions[2:]
    assert store._cache._bytes <= _WindowCache.CAPACITY_BYTES
    assert _answer(store, sessions[0]) == answer
