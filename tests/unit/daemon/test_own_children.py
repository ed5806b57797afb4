"""``own_children`` finds the same children as a scan of every process, without one:
children of every thread, and zombies (the reaper looks for those)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil
import pytest

from magi_code.daemon.health import own_children


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's lists")
def test_own_children_are_every_threads_children_zombies_included() -> None:
    exited = subprocess.Popen(["true"])  # left unreaped: a zombie
    spawned: list[subprocess.Popen[bytes]] = []
    # One from a thread that ends: its children are still ours.
    thread = threading.Thread(target=lambda: spawned.append(subprocess.Popen(["sleep", "30"])))
    thread.start()
    thread.join()
    spawned.append(subprocess.Popen(["sleep", "30"]))
    try:
        deadline = time.monotonic() + 30  # a failure bound
        while psutil.Process(exited.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the exited child never became a zombie"
            time.sleep(0.01)
        found = {child.pid for child in own_children()}
        assert found == {child.pid for child in psutil.Process().children()}
        assert {exited.pid, *(p.pid for p in spawned)} <= found
    finally:
        for process in spawned:
            process.kill()
            process.wait()
        exited.wait()
