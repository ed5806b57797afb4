"""Replay pages answered on the event loop (``SessionStore.replay_at_once``): exactly the
pages ``replay`` gives, and only where reading them cannot wait (spec: "Durable replay").

The mount table is the test's own (``tests.support.mounts``): which filesystem this
machine's temporary directory is on must not decide what is tested.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest
from tests.support.mounts import mount, use_mountinfo

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.store import APPEND_LOCK, SessionStore, WriterLease
from magi_code.storage import mounts

ANSWER = "A paragraph of the answer, long enough to need parts across pages. " * 90


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SessionStore:
    use_mountinfo(tmp_path, [mount("/", "ext4", 1)], monkeypatch)
    return SessionStore(tmp_path / "sessions")


def add_turns(lease: WriterLease, count: int, first: int = 0) -> None:
    for n in range(first, first + count):
        lease.append({"type": "user", "turn_id": f"t{n}", "text": f"question {n}"})
        lease.append({"type": "assistant", "turn_id": f"t{n}", "text": ANSWER})
        lease.append(
            {
                "type": "terminal",
                "turn_id": f"t{n}",
                "status": "completed",
                "assistant_text": ANSWER,
            }
        )


@pytest.fixture
def session(store: SessionStore) -> str:
    session_id = store.create()
    with store.acquire_writer_lease(session_id) as lease:
        add_turns(lease, 6)
    return session_id


def test_the_pages_after_the_first_are_answered_at_once_and_equal_replays(
    store: SessionStore, session: str
) -> None:
    # Nothing parsed yet: the first page needs the worker thread.
    assert store.replay_at_once(session, None, 4) is None
    page = store.replay(session, None, 4)
    at_once = 0
    while page["truncated"]:
        after = page["next_cursor"]
        fast = store.replay_at_once(session, after, 4)
        page = store.replay(session, after, 4)
        assert fast == page
        at_once += 1
    assert at_once >= 5
    # From the start again, and for a cursor that matches nothing (a resync page).
    assert store.replay_at_once(session, None, 32) == store.replay(session, None, 32)
    resync = store.replay_at_once(session, "not-a-cursor", 32)
    assert resync == store.replay(session, "not-a-cursor", 32)
    assert resync is not None and resync["resync_required"] is True


def test_a_changed_history_is_read_again_in_the_worker_thread(
    store: SessionStore, session: str
) -> None:
    store.replay(session, None, 32)
    first = store.replay_at_once(session, None, 32)
    assert first is not None
    with store.acquire_writer_lease(session) as lease:
        add_turns(lease, 1, first=6)
        # The parsed window no longer describes the file: never answered from it.
        assert store.replay_at_once(session, None, 32) is None
    page = store.replay(session, None, 32)
    assert page != first
    assert store.replay_at_once(session, None, 32) == page


def test_a_held_append_lock_leaves_the_page_to_the_worker_thread(
    store: SessionStore, session: str
) -> None:
    page = store.replay(session, None, 32)
    fd = os.open(store._root / session / APPEND_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as an append does
        assert store.replay_at_once(session, None, 32) is None
        with pytest.raises(ServiceError) as busy:
            store.replay(session, None, 32)
        assert busy.value.code is ErrorCode.SESSION_BUSY
    finally:
        os.close(fd)
    assert store.replay_at_once(session, None, 32) == page


def test_arguments_are_refused_as_replay_refuses_them(store: SessionStore, session: str) -> None:
    store.replay(session, None, 32)
    for session_id, after, limit, code in [
        ("../escape", None, 32, ErrorCode.INVALID_SESSION_ID),
        (session, None, 0, ErrorCode.INVALID_PAYLOAD),
        (session, None, 33, ErrorCode.LIMIT_EXCEEDED),
        (session, 7, 32, ErrorCode.INVALID_PAYLOAD),
        (session, "c" * 129, 32, ErrorCode.INVALID_PAYLOAD),
    ]:
        for call in (store.replay_at_once, store.replay):
            with pytest.raises(ServiceError) as refused:
                call(session_id, after, limit)
            assert refused.value.code is code


def test_a_missing_session_is_left_to_replay_to_report(store: SessionStore, session: str) -> None:
    store.replay(session, None, 32)
    other = store.create()
    shutil.rmtree(store._root / other)
    assert store.replay_at_once(other, None, 32) is None
    shutil.rmtree(store._root / session)  # gone after its window was parsed
    assert store.replay_at_once(session, None, 32) is None
    with pytest.raises(ServiceError) as gone:
        store.replay(session, None, 32)
    assert gone.value.code is ErrorCode.SESSION_UNAVAILABLE


@pytest.mark.parametrize(
    "where",
    ["network root", "network directory above", "mount inside", "link on the way", "no table"],
)
def test_never_on_the_event_loop_where_a_lookup_may_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    home = tmp_path / "home"
    root = home / "sessions"
    lines = [mount("/", "ext4", 1)]
    if where == "network root":
        lines = [mount("/", "nfs4", 1)]
    elif where == "network directory above":
        # A lookup passes through the network directory before reaching the local mount.
        lines += [mount(str(tmp_path), "nfs", 2), mount(str(home), "ext4", 3)]
    elif where == "mount inside":
        lines.append(mount(f"{root}/elsewhere", "fuse.sshfs", 2))
    elif where == "link on the way":
        (tmp_path / "real-home").mkdir()
        home.symlink_to(tmp_path / "real-home")
    use_mountinfo(tmp_path, lines, monkeypatch)
    if where == "no table":
        monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "absent"))
    store = SessionStore(root)
    session_id = store.create()
    page = store.replay(session_id, None, 32)
    assert page["events"] == [] and page["resync_required"] is False
    assert store.replay_at_once(session_id, None, 32) is None


def test_a_mount_or_unmount_waits_for_the_next_replay_to_look_again(
    store: SessionStore, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    generation = [0]
    monkeypatch.setattr(mounts.MOUNT_TABLE, "generation", lambda: generation[0])
    page = store.replay(session, None, 32)
    assert store.replay_at_once(session, None, 32) == page
    generation[0] = 1
    assert store.replay_at_once(session, None, 32) is None
    assert store.replay(session, None, 32) == page
    assert store.replay_at_once(session, None, 32) == page
