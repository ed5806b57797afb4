"""The daemon's allocation reports (``MC_DAEMON_TRACEMALLOC``): off unless asked, and a
report names where the heap grew."""

from __future__ import annotations

import asyncio
import stat
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.daemon.allocations import TRACE_ENV, AllocationTracer, trace_frames


@pytest.fixture
def stopped() -> Iterator[None]:
    yield
    tracemalloc.stop()


def test_tracing_is_off_unless_a_frame_count_is_given() -> None:
    assert trace_frames({}) == 0
    assert trace_frames({TRACE_ENV: ""}) == 0
    assert trace_frames({TRACE_ENV: "yes"}) == 0
    assert trace_frames({TRACE_ENV: "0"}) == 0
    assert trace_frames({TRACE_ENV: "1"}) == 1
    assert trace_frames({TRACE_ENV: "1000"}) == 64


async def _report(tracer: AllocationTracer, path: Path) -> str:
    tracer.request()
    for _ in range(600):
        if path.exists():
            return path.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {path.name}")


async def test_a_report_names_the_line_that_grew_since_start_and_since_the_last(
    tmp_path: Path, stopped: None
) -> None:
    tracer = AllocationTracer(tmp_path, 1)
    tracer.start()
    kept = [f"grown {i}" * 4 for i in range(20_000)]  # the growth the report must name
    first = await _report(tracer, tmp_path / "tracemalloc-1.txt")
    here = f"{__file__}:{kept_line()}"
    since_start, since_previous = first.split("since previous")
    assert here in since_start and here in since_previous
    assert stat.S_IMODE((tmp_path / "tracemalloc-1.txt").stat().st_mode) == 0o600
    # Nothing new from that line since: it is no longer among the previous report's growth.
    second = await _report(tracer, tmp_path / "tracemalloc-2.txt")
    assert here in second.split("since previous")[0]
    assert here not in second.split("since previous")[1]
    assert first.startswith("snapshot 1 ") and second.startswith("snapshot 2 ")
    del kept


def kept_line() -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if "the growth the report must" in line)
