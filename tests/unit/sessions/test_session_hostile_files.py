"""A FIFO, socket, directory or symlink planted in a session directory (any same-user
process can, the agent's own shell tool included) makes that session
``session_unavailable`` at once; it never blocks a worker. Listing skips or flags it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.store import APPEND_LOCK, HISTORY, LEASE_LOCK, META, SessionStore

T = TypeVar("T")
BOUND_S = 10.0  # only bounds how long a regression hangs; no timing is asserted

KINDS = ("fifo", "socket", "directory", "symlink")


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def promptly(call: Callable[[], T]) -> T:
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(call).result(timeout=BOUND_S)
    finally:
        pool.shutdown(wait=False)


def plant(
    store: SessionStore,
    session_id: str,
    name: str,
    kind: str,
    planted: list[Path],
    sockets: list[socket.socket],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = store._root / session_id
    path = directory / name
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path, 0o600)
        planted.append(path)
    elif kind == "socket":
        monkeypatch.chdir(directory)  # a relative name keeps sun_path short
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(name)
        sock.listen()
        sockets.append(sock)
    elif kind == "directory":
        path.mkdir()
    else:
        target = directory.parent.parent / f"target-{name}"
        target.write_bytes(b"")
        path.symlink_to(target)


def code(call: Callable[[], object]) -> ErrorCode:
    with pytest.raises(ServiceError) as info:
        promptly(call)
    return info.value.code


@pytest.fixture
def hostile(
    store: SessionStore,
    fifos: list[Path],
    sockets: list[socket.socket],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str, str], str]:
    def make(name: str, kind: str) -> str:
        session_id = store.create()
        with store.acquire_writer_lease(session_id) as lease:
            lease.append({"type": "user", "turn_id": "t1", "text": "hello there"})
        plant(store, session_id, name, kind, fifos, sockets, monkeypatch)
        return session_id

    return make


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [HISTORY, APPEND_LOCK])
def test_special_history_or_append_lock_makes_the_session_unavailable(
    store: SessionStore, hostile: Callable[[str, str], str], name: str, kind: str
) -> None:
    good = store.create()
    bad = hostile(name, kind)
    unavailable = ErrorCode.SESSION_UNAVAILABLE
    assert code(lambda: store.replay(bad, None, 32)) is unavailable
    assert code(lambda: store.load_context(bad)) is unavailable
    assert code(lambda: store.acquire_writer_lease(bad)) is unavailable
    assert code(lambda: store.turn_outcome(bad, "t1")) is unavailable
    assert code(lambda: store.find_turn_by_key(bad, "key")) is unavailable
    assert code(lambda: store.close_interrupted_turn(bad, "t1")) is unavailable
    # The other session is untouched, and the store keeps working.
    assert promptly(lambda: store.replay(good, None, 32))["events"] == []
    promptly(lambda: store.acquire_writer_lease(good)).release()


@pytest.mark.parametrize("kind", KINDS)
def test_special_lease_lock_refuses_the_lease_only(
    store: SessionStore, hostile: Callable[[str, str], str], kind: str
) -> None:
    bad = hostile(LEASE_LOCK, kind)
    assert code(lambda: store.acquire_writer_lease(bad)) is ErrorCode.SESSION_UNAVAILABLE
    # Readers never touch the lease file.
    events = promptly(lambda: store.replay(bad, None, 32))["events"]
    assert [e["text"] for e in events] == ["hello there"]
    assert promptly(lambda: store.turn_outcome(bad, "t1")) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_listing_skips_a_session_whose_history_is_special(
    store: SessionStore, hostile: Callable[[str, str], str], kind: str
) -> None:
    good = store.create()
    hostile(HISTORY, kind)
    page = promptly(lambda: store.list_sessions(None, 32))
    assert [s["session_id"] for s in page["sessions"]] == [good]
    assert page["incomplete"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_listing_flags_a_special_title_sidecar(
    store: SessionStore, hostile: Callable[[str, str], str], kind: str
) -> None:
    bad = hostile(META, kind)
    page = promptly(lambda: store.list_sessions(None, 32))
    assert [(s["session_id"], s["title"]) for s in page["sessions"]] == [(bad, None)]
    assert page["incomplete"] is True
    # Replay and the lease do not need the sidecar.
    assert promptly(lambda: store.replay(bad, None, 32))["events"] != []
    promptly(lambda: store.acquire_writer_lease(bad)).release()


def test_many_concurrent_readers_of_a_fifo_session_all_finish(
    store: SessionStore, hostile: Callable[[str, str], str]
) -> None:
    bad = hostile(HISTORY, "fifo")
    good = store.create()
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        futures = [pool.submit(store.replay, bad, None, 32) for _ in range(16)]
        for future in futures:
            with pytest.raises(ServiceError) as info:
                future.result(timeout=BOUND_S)
            assert info.value.code is ErrorCode.SESSION_UNAVAILABLE
        # Every worker is free again: a healthy session still answers on the same pool.
        assert pool.submit(store.replay, good, None, 32).result(timeout=BOUND_S)["gap"] is False
    finally:
        pool.shutdown(wait=False)
