"""What the daemon's Python heap holds, by allocation site, on request (off by default).

A diagnostic for the soak (``benchmarks/soak.py --tracemalloc``) and for a daemon that
grows in the field: with ``MC_DAEMON_TRACEMALLOC=<frames>`` in its environment the daemon
starts :mod:`tracemalloc` once its modules are loaded (what start-up imports is not
traced), keeping ``<frames>`` frames of each allocation's stack (1 to 64). Each
``SIGUSR2`` then writes ``tracemalloc-<n>.txt`` (0600) in the daemon's ``run/``
directory: the traced total, tracemalloc's own memory and RSS, and the allocation sites
that grew most since the first snapshot and since the previous one. Only taking the
snapshot holds the loop (copying the traces); comparing and writing run in a worker
thread, one report at a time. Tracing itself makes every allocation slower, so this is
never on unless asked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from magi_code.storage.files import atomic_write

from .heap import resident_bytes

log = logging.getLogger("magi_code.daemon")

TRACE_ENV: Final = "MC_DAEMON_TRACEMALLOC"
MAX_FRAMES: Final = 64
TOP: Final = 25
# Neither the tracers' own bookkeeping nor the import machinery's is the daemon's growth.
_IGNORED: Final = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, __file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
)


def trace_frames(env: Mapping[str, str]) -> int:
    """The frames ``MC_DAEMON_TRACEMALLOC`` asks for; 0 (off) when unset or not a number."""
    raw = env.get(TRACE_ENV, "")
    return min(int(raw), MAX_FRAMES) if raw.isdigit() else 0


# An allocation site (its stack, innermost frame last) -> (bytes, blocks) there.
Sites = dict[tracemalloc.Traceback, tuple[int, int]]


class AllocationTracer:
    """Started with :meth:`start`; each :meth:`request` writes one numbered report."""

    def __init__(self, directory: Path, frames: int) -> None:
        self._directory = directory
        self._frames = frames
        # Each snapshot is kept grouped by site only: a fraction of its traces' memory.
        self._first: Sites = {}
        self._previous: Sites = {}
        self._count = 0
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        tracemalloc.start(self._frames)
        self._first = self._previous = self._sites(tracemalloc.take_snapshot())

    def request(self) -> None:
        """Take a snapshot now and write its report soon (a signal handler)."""
        task = asyncio.get_running_loop().create_task(self._report(tracemalloc.take_snapshot()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, snapshot: tracemalloc.Snapshot) -> None:
        traced = (*tracemalloc.get_traced_memory(), tracemalloc.get_tracemalloc_memory())
        async with self._lock:
            path = await asyncio.to_thread(self.write, snapshot, traced)
        log.info("wrote %s", path.name)

    def write(self, snapshot: tracemalloc.Snapshot, traced: tuple[int, int, int]) -> Path:
        """Write ``tracemalloc-<n>.txt`` (n from 1) for ``snapshot``; ``traced`` is the
        traced memory, its peak and the tracer's own, when it was taken. Returns its path."""
        sites = self._sites(snapshot)
        del snapshot
        self._count += 1
        current, peak, own = (value / 2**20 for value in traced)
        rss = resident_bytes()
        lines = [
            f"snapshot {self._count} pid {os.getpid()} frames {self._frames}",
            f"traced {current:.2f} MiB (peak {peak:.2f} MiB), tracemalloc's own {own:.2f} MiB"
            + (f", rss {rss / 2**20:.2f} MiB" if rss is not None else ""),
        ]
        for title, base in (("since start", self._first), ("since previous", self._previous)):
            lines.append("")
            lines.append(f"top {TOP} growth {title} (size diff, count diff, site):")
            lines.extend(_growth(sites, base))
        self._previous = sites
        path = self._directory / f"tracemalloc-{self._count}.txt"
        atomic_write(path, ("\n".join(lines) + "\n").encode(), 0o600)
        return path

    def _sites(self, snapshot: tracemalloc.Snapshot) -> Sites:
        key = "traceback" if self._frames > 1 else "lineno"
        return {
            stat.traceback: (stat.size, stat.count)
            for stat in snapshot.filter_traces(_IGNORED).statistics(key)
        }


def _growth(sites: Sites, base: Sites) -> list[str]:
    """The sites whose size changed most (either way), largest change first."""
    diffs = [
        (size - base.get(site, (0, 0))[0], count - base.get(site, (0, 0))[1], site)
        for site, (size, count) in sites.items()
    ]
    diffs += [(-size, -count, site) for site, (size, count) in base.items() if site not in sites]
    diffs.sort(key=lambda diff: abs(diff[0]), reverse=True)
    lines = []
    for size, count, site in diffs[:TOP]:
        lines.append(f"{size / 1024:+10.1f} KiB {count:+8d}")
        # Innermost frame first: where the block was allocated, then its callers.
        for frame in reversed(site):
            lines.append(f"      {frame.filename}:{frame.lineno}")
    return lines
