"""Every conformance scenario through the daemon's core in this process.

The same scenarios as ``test_fixtures.py``, bridged by the real shim code to the real
daemon roles and coordinator over the in-memory transport (no processes, no socket).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.fixture_runner import run_scenario, scenario_files
from tests.support.inprocess import V1Service, in_memory_daemon


@pytest.fixture
def service_mode() -> Iterator[str]:
    """Overrides the mode matrix: there is one mode here."""
    yield "in_memory"


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
async def test_scenario_in_memory(path: Path, home: Path, project: Path) -> None:
    async with in_memory_daemon(home, project) as daemon:
        service = await V1Service.start(daemon)
        try:
            await run_scenario(path, service)
        finally:
            await service.stop()
