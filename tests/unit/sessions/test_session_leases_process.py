"""Writer leases across processes (spec: another service cannot attach while the lease
is held; a crashed holder must not block others forever)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.store import SessionStore

HOLDER = """
import sys
import threading
from pathlib import Path
from magi_code.sessions.store import SessionStore
lease = SessionStore(Path(sys.argv[1])).acquire_writer_lease(sys.argv[2])
lease.append({"type": "user", "turn_id": "child", "text": "from child"})
print("ready", flush=True)
sys.stdin.read()
"""


def _wait_ready(proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], timeout)
    assert readable, "holder did not report ready"
    assert proc.stdout.readline().strip() == "ready"


def test_lease_held_by_another_process_is_busy_until_it_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = SessionStore(root)
    session = store.create()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), session],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_ready(proc)
        with pytest.raises(ServiceError) as info:
            store.acquire_writer_lease(session)
        assert info.value.code is ErrorCode.SESSION_BUSY
        # Replay needs no lease and sees the child's durable record.
        page = store.replay(session, None, 32)
        assert [e["text"] for e in page["events"]] == ["from child"]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    with store.acquire_writer_lease(session) as lease:
        assert lease.append({"type": "assistant", "turn_id": "child", "text": "after"}) == 2


def test_a_released_lease_is_free_while_another_thread_spawns_processes(tmp_path: Path) -> None:
    """A process being spawned holds a copy of every descriptor until its exec, the
    lease's included: a reopen right after a close must not take that for a holder."""
    store = SessionStore(tmp_path / "sessions")
    session = store.create()
    stop = threading.Event()

    def spawn() -> None:
        while not stop.is_set():
            subprocess.run(["true"], check=True)

    spawner = threading.Thread(target=spawn)
    spawner.start()
    try:
        for _ in range(300):
            store.acquire_writer_lease(session).release()
    finally:
        stop.set()
        spawner.join(timeout=30)
