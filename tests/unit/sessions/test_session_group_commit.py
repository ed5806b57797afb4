"""Group commit of session records on real files (``sessions/commit.py``).

Batches are made deterministic by holding ``append.lock`` shared from the test, as any
reader does: the flush in progress waits for the lock, and everything submitted
meanwhile must go out as the next batch, with one fsync. Write failures are real: a
file-size limit (``RLIMIT_FSIZE``) in a child process, and a full tmpfs where mounting one
is allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions import store as store_module
from magi_code.sessions.records import ToolCallRecord, decode_line
from magi_code.sessions.store import APPEND_LOCK, HISTORY, SessionStore, WriterLease

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def call(turn: str, call_id: str) -> dict[str, object]:
    return {
        "type": "tool_call",
        "turn_id": turn,
        "call_id": call_id,
        "name": "t",
        "arguments": "{}",
    }


@contextlib.contextmanager
def reader_holds_the_append_lock(store: SessionStore, session_id: str) -> Iterator[None]:
    fd = os.open(store._root / session_id / APPEND_LOCK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # drops the lock


def on_disk(store: SessionStore, session_id: str) -> list[tuple[int, str]]:
    """(seq, call_id) of every tool_call line, in file order; every line must decode."""
    data = (store._root / session_id / HISTORY).read_bytes()
    assert data.endswith(b"\n")
    found = []
    for line in data.split(b"\n")[1:-1]:  # after the header
        record = decode_line(line)
        assert isinstance(record, ToolCallRecord), line
        found.append((record.seq, record.call_id))
    return found


def wait_until(condition: object, what: str) -> None:
    for _ in range(5000):
        if callable(condition) and condition():
            return
        threading.Event().wait(0.002)
    raise AssertionError(f"timed out waiting for {what}")


def test_records_queued_during_a_flush_share_the_next_batch(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    acknowledged: list[tuple[int, str]] = []
    lock = threading.Lock()

    def writer(name: str, count: int) -> None:
        # Submit everything, then wait for each record (as a turn does with its events).
        submitted = [(lease.submit(call(name, f"{name}-{i}")), f"{name}-{i}") for i in range(count)]
        for seq, call_id in submitted:
            lease.wait_durable(seq)
            with lock:
                acknowledged.append((seq, call_id))

    with reader_holds_the_append_lock(store, session):
        # Its flush takes what is queued and waits for the lock; nothing is durable yet.
        first = lease.submit(call("first", "first"))
        threads = [threading.Thread(target=writer, args=(f"w{i}", 25)) for i in range(8)]
        for thread in threads:
            thread.start()
        wait_until(lambda: lease.submitted_seq == first + 200, "every submit")
        assert lease.durable_seq == first - 1 and acknowledged == []
    for thread in threads:
        thread.join()
    lease.wait_durable(first)
    # What the waiting flush had taken, then everything queued behind it: two fsyncs at
    # most for 201 records (one, if that flush had not taken its batch yet).
    assert lease.batches <= 2
    assert lease.durable_seq == first + 200
    assert len({seq for seq, _ in acknowledged}) == 200
    lease.release()
    disk = on_disk(store, session)
    assert [seq for seq, _ in disk] == list(range(first, first + 201))  # in seq order
    assert set(acknowledged) <= set(disk)
    # Each writer's records are in the order it appended them.
    for i in range(8):
        mine = [cid for _, cid in disk if cid.startswith(f"w{i}-")]
        assert mine == [f"w{i}-{k}" for k in range(25)]


async def test_concurrent_tasks_await_their_own_records(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    async def task(name: str) -> list[int]:
        seqs = []
        for index in range(20):
            seq = await lease.append_async(call(name, f"{name}-{index}"))
            assert lease.durable_seq >= seq  # acknowledged means durable
            seqs.append(seq)
        return seqs

    results = await asyncio.gather(*(task(f"t{i}") for i in range(10)))
    acknowledged = {seq for seqs in results for seq in seqs}
    assert len(acknowledged) == 200
    assert lease.batches < 200  # ten writers at once share fsyncs
    await asyncio.to_thread(lease.release)
    disk = on_disk(store, session)
    assert {seq for seq, _ in disk} == acknowledged
    assert [seq for seq, _ in disk] == sorted(seq for seq, _ in disk)


async def test_enqueue_returns_before_the_fsync_and_durable_waits_for_it(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    with reader_holds_the_append_lock(store, session):
        seq = await lease.enqueue(call("t", "c1"))
        assert lease.durable_seq < seq
        waiter = asyncio.create_task(lease.durable(seq))
        cancelled = asyncio.create_task(lease.durable(seq))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        cancelled.cancel()
    await asyncio.wait_for(waiter, 10)
    assert lease.durable_seq == seq
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await lease.durable(seq - 1)  # already durable: returns at once


async def test_enqueue_waits_only_once_too_far_ahead_of_durability(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    ahead = WriterLease.MAX_PENDING_RECORDS
    with reader_holds_the_append_lock(store, session):
        for index in range(ahead):  # none of these is durable, none waits
            await asyncio.wait_for(lease.enqueue(call("t", f"c{index}")), 5)
        over = asyncio.create_task(lease.enqueue(call("t", "over")))
        await asyncio.sleep(0.05)
        assert not over.done()  # one more would be too far ahead: it waits
    assert await asyncio.wait_for(over, 10) == ahead + 1
    await lease.durable(ahead + 1)
    assert len(on_disk(store, session)) == ahead + 1


def test_release_writes_what_was_submitted_first(
    store: SessionStore, session: str, lease: WriterLease
) -> None:
    with reader_holds_the_append_lock(store, session):
        for index in range(5):
            lease.submit(call("t", f"c{index}"))
        releasing = threading.Thread(target=lease.release)
        releasing.start()
        threading.Event().wait(0.05)
        assert releasing.is_alive()  # waits for the flush
    releasing.join(10)
    assert not releasing.is_alive()
    assert [cid for _, cid in on_disk(store, session)] == [f"c{i}" for i in range(5)]
    with pytest.raises(ServiceError) as info:
        lease.submit(call("t", "late"))
    assert info.value.code is ErrorCode.SESSION_UNAVAILABLE


def test_invalid_records_fail_at_submit_and_use_no_seq(lease: WriterLease) -> None:
    before = lease.submitted_seq
    with pytest.raises(ValueError):
        lease.submit({"type": "tool_call", "turn_id": "t"})
    with pytest.raises(ServiceError) as info:
        lease.submit({"type": "user", "turn_id": "t", "text": "x" * (1024 * 1024)})
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED
    assert lease.submitted_seq == before
    assert lease.append(call("t", "ok")) == before + 1


def test_a_batch_that_cannot_take_the_lock_fails_busy_and_breaks_the_lease(
    store: SessionStore, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "WRITER_LOCK_WAIT", 0.2)
    lease = store.acquire_writer_lease(session)
    try:
        durable = lease.append(call("t", "kept"))
        with reader_holds_the_append_lock(store, session):
            busy = lease.submit(call("t", "busy"))
            wait_until(lambda: lease._commit.queued == 0, "the flush to take its batch")
            behind = lease.submit(call("t", "behind"))
            with pytest.raises(ServiceError) as info:
                lease.wait_durable(busy)
            assert info.value.code is ErrorCode.SESSION_BUSY  # the batch that waited
            with pytest.raises(ServiceError) as info:
                lease.wait_durable(behind)
            assert info.value.code is ErrorCode.SESSION_UNAVAILABLE  # queued behind it
        lease.wait_durable(durable)  # still durable
        with pytest.raises(ServiceError) as info:
            lease.submit(call("t", "after"))
        assert info.value.code is ErrorCode.SESSION_UNAVAILABLE
    finally:
        lease.release()
    assert [cid for _, cid in on_disk(store, session)] == ["kept"]
    # A new lease works again.
    with store.acquire_writer_lease(session) as again:
        again.append(call("t", "again"))
    assert [cid for _, cid in on_disk(store, session)] == ["kept", "again"]


# The child appends under a file-size limit: the batch that crosses it fails on write().
_FSIZE_CHILD = textwrap.dedent(
    """
    import fcntl, json, os, resource, signal, sys, time
    from pathlib import Path
    from magi_code.protocol.errors import ServiceError
    from magi_code.sessions.store import SessionStore

    root = Path(sys.argv[1])
    store = SessionStore(root)
    sid = store.create()
    lease = store.acquire_writer_lease(sid)
    history = root / sid / "history.jsonl"

    def call(cid):
        return {"type": "tool_call", "turn_id": "t", "call_id": cid, "name": "n",
                "arguments": "x" * 200}

    def taken():  # the flush took everything queued (it now waits for the lock)
        while lease._commit.queued:
            time.sleep(0.001)

    acknowledged = [lease.append(call(f"ok{i}")) for i in range(3)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # Room for about two more records.
    limit = history.stat().st_size + 600
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    lock = os.open(root / sid / "append.lock", os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_SH)
    alone = lease.submit(call("alone"))  # a batch of its own: fits
    taken()
    # Queued behind it: the next batch, which crosses the limit mid-line.
    crossing = [lease.submit(call(f"batch{i}")) for i in range(4)]
    fcntl.flock(lock, fcntl.LOCK_UN)
    outcomes = {}
    for seq in [alone, *crossing]:
        try:
            lease.wait_durable(seq)
            outcomes[seq] = None
        except ServiceError as exc:
            outcomes[seq] = exc.code.value
    try:
        lease.submit(call("later"))
        later = None
    except ServiceError as exc:
        later = exc.code.value
    lease.release()
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    print(json.dumps({"session": sid, "acknowledged": acknowledged, "alone": alone,
                      "crossing": crossing, "outcomes": outcomes, "later": later,
                      "limit": limit, "batches": lease.batches}))
    """
)


def test_a_failed_write_fails_exactly_its_batch_and_keeps_acknowledged_records(
    tmp_path: Path,
) -> None:
    root = tmp_path / "sessions"
    done = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout)
    outcomes = {int(seq): code for seq, code in result["outcomes"].items()}
    assert outcomes[result["alone"]] is None  # its own batch fitted: durable
    assert {outcomes[seq] for seq in result["crossing"]} == {"session_unavailable"}
    assert result["later"] == "session_unavailable"
    assert result["batches"] == 5  # three appends, the record alone, the crossing batch
    store = SessionStore(root)
    history = root / result["session"] / HISTORY
    # The torn batch was cut off: the file ends with the last durable record.
    assert history.stat().st_size < result["limit"]
    durable = [*result["acknowledged"], result["alone"]]
    assert [seq for seq, _ in on_disk(store, result["session"])] == durable
    with store.acquire_writer_lease(result["session"]) as lease:
        assert lease.append(call("t", "next")) == durable[-1] + 1


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_a_full_disk_fails_the_records_of_the_batch_and_the_lease(
    small_tmpfs: Path,
) -> None:
    store = SessionStore(small_tmpfs / "sessions")
    session = store.create()
    lease = store.acquire_writer_lease(session)
    try:
        kept = await lease.append_async(call("t", "kept"))
        size = (small_tmpfs / "sessions" / session / HISTORY).stat().st_size
        filler = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(filler, b"\0" * 512)
        finally:
            os.close(filler)
        seqs = [lease.submit(call("t", f"full{i}" + "y" * 3000)) for i in range(4)]
        outcomes = await asyncio.gather(
            *(lease.durable(seq) for seq in seqs), return_exceptions=True
        )
        assert all(
            isinstance(o, ServiceError) and o.code is ErrorCode.SESSION_UNAVAILABLE
            for o in outcomes
        ), outcomes
        await lease.durable(kept)
    finally:
        await asyncio.to_thread(lease.release)
    assert (small_tmpfs / "sessions" / session / HISTORY).stat().st_size == size
    assert [cid for _, cid in on_disk(store, session)] == ["kept"]
