"""A cancelled on-demand start stops: the start lock is free again at once, not when the
start's 30 s deadline passes. Real locks and files under a temporary MC_HOME; the
lifetime lock is held by this test (a daemon that is starting), so the starter waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from magi_code.client.starter import ensure_daemon
from magi_code.endpoint.lock import LifetimeLock, StartLockTimeout, start_lock
from magi_code.endpoint.paths import ensure_private_dir, runtime_paths
from magi_code.storage.launch import LaunchContext


async def test_a_cancelled_start_releases_the_start_lock(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"MC_HOME": str(home), "XDG_RUNTIME_DIR": str(runtime), "MC_DAEMON_NO_SCOPE": "1"}
    ctx = LaunchContext(home, tmp_path, env)
    paths = runtime_paths(ctx)
    ensure_private_dir(paths.state_dir)
    lifetime = LifetimeLock.acquire(paths.lock)
    assert lifetime is not None
    try:
        start = asyncio.create_task(ensure_daemon(ctx))
        # The starter holds the start lock and waits for the "starting" daemon.
        async with asyncio.timeout(10):
            while True:
                try:
                    with start_lock(paths.start_lock, 0.01):
                        pass
                except StartLockTimeout:  # taken: the starter has it
                    break
                await asyncio.sleep(0.02)
        start.cancel()
        try:
            await start
        except asyncio.CancelledError:
            pass
        # A second starter gets it long before the first start's deadline (30 s) would
        # have let it go (StartLockTimeout otherwise).
        await asyncio.to_thread(_take, paths.start_lock)
    finally:
        lifetime.release()


def _take(path: Path) -> None:
    with start_lock(path, 5.0):
        pass
