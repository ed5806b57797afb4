"""``MC_DAEMON_TRACEMALLOC``: a real daemon started with it writes an allocation report
into its ``run/`` directory on each SIGUSR2, and goes on serving."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

from magi_code.daemon.allocations import TRACE_ENV
from tests.process.daemon.support import paths, persistent, wait_for


async def test_sigusr2_writes_a_report_when_tracing_was_asked_for(
    home: Path, project: Path
) -> None:
    client = await persistent(home, project, **{TRACE_ENV: "1"})
    try:
        pid = (await client.status())["pid"]
        run = paths(home).state_dir
        for n in (1, 2):
            os.kill(pid, signal.SIGUSR2)
            report = run / f"tracemalloc-{n}.txt"
            await wait_for(report.exists, 60, f"tracemalloc-{n}.txt")
            text = report.read_text()
            assert text.startswith(f"snapshot {n} pid {pid} frames 1\n"), text[:200]
            assert "top 25 growth since start" in text and "since previous" in text
            assert stat.S_IMODE(report.stat().st_mode) == 0o600
        # Still serving.
        assert (await client.status())["pid"] == pid
    finally:
        await client.close()
