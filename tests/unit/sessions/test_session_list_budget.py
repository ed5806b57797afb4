"""session.list over a directory larger than the scan budget: ``limit_exceeded`` for a v1
client (no arbitrary partial page); for a persistent client (``page_past_budget``) pages
that say ``incomplete`` and go forward deterministically. Stale ``.new-*`` staging
directories never break a listing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_SESSION_LIST_SCAN_ENTRIES
from magi_code.sessions.ids import validate_session_id
from magi_code.sessions.store import HISTORY, SessionStore


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def fill(store: SessionStore, count: int, prefix: str = "junk") -> None:
    """``count`` more directory entries that are not sessions (hard links: cheap)."""
    root_fd = os.open(store._root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not os.path.exists(store._root / "junk"):
            os.close(os.open("junk", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=root_fd))
            count -= 1
        for index in range(count):
            os.link("junk", f"{prefix}{index}", src_dir_fd=root_fd, dst_dir_fd=root_fd)
    finally:
        os.close(root_fd)


def examined_sessions(store: SessionStore) -> list[str]:
    """The sessions among the first budget-many entries, in the order the store reads."""
    found = []
    with os.scandir(store._root) as entries:
        for examined, entry in enumerate(entries, start=1):
            if examined > MAX_SESSION_LIST_SCAN_ENTRIES:
                break
            try:
                validate_session_id(entry.name)
            except Exception:
                continue
            if (Path(entry.path) / HISTORY).is_file():
                found.append(entry.name)
    return sorted(found)


def pages(store: SessionStore, limit: int) -> Iterator[dict[str, object]]:
    after = None
    for _ in range(10_000):
        page = store.list_sessions(after, limit, page_past_budget=True)
        yield page
        if not page["truncated"]:
            return
        assert page["next_after"] is not None
        assert after is None or page["next_after"] > after  # always moves forward
        after = page["next_after"]
    raise AssertionError("listing did not finish")


def listed(page: dict[str, object]) -> list[str]:
    sessions = page["sessions"]
    assert isinstance(sessions, list)
    return [s["session_id"] for s in sessions]


def test_exactly_at_the_budget_is_complete(store: SessionStore) -> None:
    ids = sorted(store.create() for _ in range(3))
    fill(store, MAX_SESSION_LIST_SCAN_ENTRIES - 3)
    page = store.list_sessions(None, 32)
    assert listed(page) == ids
    assert page["incomplete"] is False and page["truncated"] is False


def test_one_entry_over_the_budget_is_limit_exceeded_for_v1(store: SessionStore) -> None:
    store.create()
    fill(store, MAX_SESSION_LIST_SCAN_ENTRIES)
    for after in (None, "ses_0", "ses_zzzzzzzzzzzzzzzzzzzzzzzzzz"):
        with pytest.raises(ServiceError) as raised:
            store.list_sessions(after, 32)
        assert raised.value.code is ErrorCode.LIMIT_EXCEEDED
    # Still so when the scan is served from the index.
    with pytest.raises(ServiceError):
        store.list_sessions(None, 32)


def test_over_the_budget_a_persistent_client_pages_with_incomplete(store: SessionStore) -> None:
    ids = sorted(store.create() for _ in range(70))
    fill(store, MAX_SESSION_LIST_SCAN_ENTRIES)  # 70 entries more than one request examines
    expected = examined_sessions(store)
    assert 0 < len(expected) <= len(ids)

    first = [dict(page) for page in pages(store, 16)]
    seen = [sid for page in first for sid in listed(page)]
    # Ordered by ID, no repeats, exactly the sessions among the examined entries.
    assert seen == expected
    assert all(page["incomplete"] is True for page in first)
    assert first[-1]["truncated"] is False and first[-1]["next_after"] is None
    # Deterministic: the unchanged directory gives the same pages again.
    assert [dict(page) for page in pages(store, 16)] == first


def test_a_page_past_every_examined_session_ends_the_listing(store: SessionStore) -> None:
    store.create()
    fill(store, MAX_SESSION_LIST_SCAN_ENTRIES + 5)
    after = "ses_zzzzzzzzzzzzzzzzzzzzzzzzzz"
    page = store.list_sessions(after, 32, page_past_budget=True)
    assert page == {"sessions": [], "next_after": None, "truncated": False, "incomplete": True}


def test_many_stale_staging_directories_do_not_break_listing(store: SessionStore) -> None:
    ids = sorted(store.create() for _ in range(4))
    for index in range(50):
        # What a create interrupted by a crash leaves: some of its files, maybe none.
        staging = store._root / f".new-ses_{index:026d}"
        staging.mkdir()
        if index % 2:
            (staging / HISTORY).write_bytes(b'{"v":1,"seq":0,"type":"hea')
        if index % 3 == 0:
            os.mkfifo(staging / "append.lock")
    first = store.list_sessions(None, 3)
    rest = store.list_sessions(first["next_after"], 3)
    assert listed(first) + listed(rest) == ids
    assert first["incomplete"] is False and rest["incomplete"] is False
    assert rest["truncated"] is False
