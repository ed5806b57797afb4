"""A session's ``queue.json`` (RFC-0002 §6.12, docs/sessions.md) on real files: changes
under the append lock, the order kept, an unreadable file never taken for an empty one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.queue import MAX_QUEUE_ENTRIES, QUEUE, QueueEntry
from magi_code.sessions.store import SessionStore


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "sessions"


@pytest.fixture
def store(store_dir: Path) -> SessionStore:
    return SessionStore(store_dir)


def _entry(n: int) -> QueueEntry:
    return QueueEntry(f"q_{n:016x}", f"prompt {n}", "client#1", "2026-12-05T03:00:00.000Z")


def test_a_new_session_has_an_empty_queue_and_changes_persist_in_order(
    store: SessionStore, store_dir: Path
) -> None:
    session_id = store.create()
    assert store.queue(session_id) == []
    store.change_queue(session_id, lambda es: [*es, _entry(1), _entry(2)])
    store.change_queue(session_id, lambda es: [_entry(0), *es])
    assert store.queue(session_id) == [_entry(0), _entry(1), _entry(2)]
    # Leaving it as it is writes nothing.
    path = store_dir / session_id / QUEUE
    before = path.stat().st_mtime_ns
    assert store.change_queue(session_id, lambda es: None) == store.queue(session_id)
    assert path.stat().st_mtime_ns == before
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_an_unreadable_queue_is_unavailable_and_left_alone(
    store: SessionStore, store_dir: Path
) -> None:
    session_id = store.create()
    path = store_dir / session_id / QUEUE
    path.write_bytes(b"not json")
    for call in (
        lambda: store.queue(session_id),
        lambda: store.change_queue(session_id, lambda es: [*es, _entry(1)]),
    ):
        with pytest.raises(ServiceError) as failed:
            call()
        assert failed.value.code == ErrorCode.SESSION_UNAVAILABLE
    assert path.read_bytes() == b"not json"
    path.unlink()
    os.mkfifo(path)  # a special file is refused without blocking
    with pytest.raises(ServiceError):
        store.queue(session_id)


def test_a_hand_edited_queue_is_read_up_to_its_bound(store: SessionStore, store_dir: Path) -> None:
    session_id = store.create()
    many = [_entry(n).item() for n in range(MAX_QUEUE_ENTRIES + 5)]
    junk = [{"entry_id": 3}, "x"]
    path = store_dir / session_id / QUEUE
    path.write_text(json.dumps({"v": 1, "entries": junk + many}))
    assert store.queue(session_id) == [_entry(n) for n in range(MAX_QUEUE_ENTRIES)]


def test_a_missing_session_has_no_queue(store: SessionStore) -> None:
    with pytest.raises(ServiceError) as missing:
        store.change_queue("ses_missing", lambda es: es)
    assert missing.value.code == ErrorCode.SESSION_UNAVAILABLE
    with pytest.raises(ServiceError) as bad:
        store.queue("../x")
    assert bad.value.code == ErrorCode.INVALID_SESSION_ID
