"""The session library on real files: recorded project, rename, archive, library pages
by last activity with filters and cursors (RFC-0002 §6.11, docs/sessions.md)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson
import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.listing import BadCursor, LibraryQuery
from magi_code.sessions.store import HISTORY, SessionStore


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def touch(store: SessionStore, session_id: str, seconds: int) -> None:
    """Give the session's history a last-activity time (whole seconds since the epoch)."""
    path = store._root / session_id / HISTORY
    os.utime(path, ns=(seconds * 10**9, seconds * 10**9))


def ids(page: dict[str, object]) -> list[str]:
    sessions = page["sessions"]
    assert isinstance(sessions, list)
    return [s["session_id"] for s in sessions]


def test_project_dir_is_recorded_resolved_and_listed(store: SessionStore, tmp_path: Path) -> None:
    real = tmp_path / "proj"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    made = store.create(tmp_path / "link")
    old = store.create()  # as a session of a version that recorded no project
    page = store.library(LibraryQuery())
    by_id = {s["session_id"]: s for s in page["sessions"]}  # type: ignore[attr-defined]
    assert by_id[made]["project_dir"] == str(real)
    assert by_id[old]["project_dir"] is None
    assert by_id[made]["archived"] is False
    assert ids(store.library(LibraryQuery(project_dir=str(tmp_path / "link")))) == [made]
    assert ids(store.library(LibraryQuery(project_dir=str(real)))) == [made]
    assert ids(store.library(LibraryQuery(project_dir=str(tmp_path)))) == []


def test_the_first_prompt_titles_a_session_with_a_recorded_project(
    store: SessionStore, tmp_path: Path
) -> None:
    session = store.create(tmp_path)
    with store.acquire_writer_lease(session) as lease:
        lease.append({"type": "user", "turn_id": "t", "text": "Fix the parser"})
        lease.append({"type": "user", "turn_id": "u", "text": "not the title"})
    item = store.library(LibraryQuery())["sessions"][0]  # type: ignore[index]
    assert item["title"] == "Fix the parser"
    assert item["project_dir"] == str(tmp_path)


def test_rename_wins_over_the_prompt_title_before_and_after(store: SessionStore) -> None:
    early, late = store.create(), store.create()
    assert store.rename(early, "My\x07 chosen  title")["title"] == "My chosen title"
    with store.acquire_writer_lease(early) as lease:
        lease.append({"type": "user", "turn_id": "t", "text": "prompt text"})
    with store.acquire_writer_lease(late) as lease:
        lease.append({"type": "user", "turn_id": "t", "text": "prompt text"})
    store.rename(late, "Renamed")
    titles = {s["session_id"]: s["title"] for s in store.list_sessions(None, 32)["sessions"]}  # type: ignore[attr-defined]
    assert titles == {early: "My chosen title", late: "Renamed"}
    with pytest.raises(ValueError):
        store.rename(late, " \x07 ")


def test_rename_and_archive_need_no_writer_lease(store: SessionStore) -> None:
    session = store.create()
    with store.acquire_writer_lease(session) as lease:
        assert store.rename(session, "Held")["title"] == "Held"
        assert store.set_archived(session, True)["archived"] is True
        lease.append({"type": "user", "turn_id": "t", "text": "a prompt"})
    item = store.library(LibraryQuery(archived=True))["sessions"][0]  # type: ignore[index]
    assert (item["title"], item["archived"]) == ("Held", True)


def test_archive_hides_from_default_lists_and_unarchive_shows_again(store: SessionStore) -> None:
    kept, hidden = sorted(store.create() for _ in range(2))
    store.set_archived(hidden, True)
    v1 = store.list_sessions(None, 32)
    assert ids(v1) == [kept] and v1["incomplete"] is False
    assert ids(store.library(LibraryQuery())) == [kept]
    assert ids(store.library(LibraryQuery(archived=True))) == [hidden]
    assert sorted(ids(store.library(LibraryQuery(archived="all")))) == [kept, hidden]
    # Archived, never deleted: the history is still there and replays.
    assert store.replay(hidden, None, 32)["events"] == []
    assert store.set_archived(hidden, False)["archived"] is False
    assert ids(store.list_sessions(None, 32)) == [kept, hidden]


def test_library_sorts_by_last_activity_and_pages_with_cursors(store: SessionStore) -> None:
    made = [store.create() for _ in range(5)]
    for seconds, session in zip((300, 100, 500, 200, 500), made, strict=True):
        touch(store, session, 1_700_000_000 + seconds)
    ties = sorted((made[2], made[4]))
    expected = [*ties, made[0], made[3], made[1]]
    seen: list[str] = []
    cursor = None
    while True:
        page = store.library(LibraryQuery(cursor=cursor, limit=2))
        seen += ids(page)
        cursor = page["next_cursor"]  # type: ignore[assignment]
        if cursor is None:
            break
    assert seen == expected
    first = store.library(LibraryQuery(limit=1))["sessions"][0]  # type: ignore[index]
    assert first["updated_at"] == "2023-11-14T22:21:40.000Z"
    with pytest.raises(BadCursor):
        store.library(LibraryQuery(cursor="nope"))
    with pytest.raises(BadCursor):
        store.library(LibraryQuery(cursor="12:../etc"))


def test_title_filter_is_a_case_insensitive_substring(store: SessionStore) -> None:
    a, b, untitled = store.create(), store.create(), store.create()
    store.rename(a, "Fix the Parser")
    store.rename(b, "Write docs")
    assert ids(store.library(LibraryQuery(title="parser"))) == [a]
    assert ids(store.library(LibraryQuery(title="PARSER"))) == [a]
    assert untitled not in ids(store.library(LibraryQuery(title="")))


def test_metadata_changes_keep_each_other(store: SessionStore, tmp_path: Path) -> None:
    session = store.create(tmp_path)
    store.rename(session, "One")
    store.set_archived(session, True)
    meta = orjson.loads((store._root / session / "meta.json").read_bytes())
    assert meta["title"] == "One" and meta["archived"] is True
    assert meta["project_dir"] == str(tmp_path) and meta["v"] == 1


def test_concurrent_changes_are_not_lost(store: SessionStore) -> None:
    session = store.create()
    errors: list[BaseException] = []

    def flip() -> None:
        try:
            for _ in range(20):
                store.set_archived(session, True)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=flip)
    worker.start()
    for n in range(20):
        store.rename(session, f"title {n}")
    worker.join()
    assert errors == []
    item = store.library(LibraryQuery(archived=True))["sessions"][0]  # type: ignore[index]
    assert (item["title"], item["archived"]) == ("title 19", True)


def test_unreadable_metadata_is_refused_not_overwritten(store: SessionStore) -> None:
    session = store.create()
    meta = store._root / session / "meta.json"
    meta.write_bytes(b"{broken")
    with pytest.raises(ServiceError) as caught:
        store.rename(session, "x")
    assert caught.value.code is ErrorCode.SESSION_UNAVAILABLE
    assert meta.read_bytes() == b"{broken"
    assert store.library(LibraryQuery())["incomplete"] is True


def test_missing_and_invalid_sessions(store: SessionStore) -> None:
    with pytest.raises(ServiceError) as caught:
        store.set_archived("ses_missing", True)
    assert caught.value.code is ErrorCode.SESSION_UNAVAILABLE
    with pytest.raises(ServiceError) as caught:
        store.rename("../x", "t")
    assert caught.value.code is ErrorCode.INVALID_SESSION_ID
