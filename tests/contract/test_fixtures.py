"""Every conformance scenario, driven through the real service process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.fixture_runner import run_scenario, scenario_files
from tests.support.service import ServiceProcess

# What each transport does itself: reading records off a byte stream, the envelope, the
# size and nesting bounds of a record. These scenarios run in both modes; the others are
# answered by the one v1 connection and core both modes drive (and run in-memory in
# test_fixtures_in_memory.py), so they run in the default mode. `make conformance` runs
# every scenario in both modes (tests/contract/conformance.py).
TRANSPORT_SCENARIOS = ("framing.", "envelope.", "limits.")


def scenarios() -> list[object]:
    return [
        pytest.param(
            path,
            id=path.stem,
            marks=[pytest.mark.both_modes] if path.stem.startswith(TRANSPORT_SCENARIOS) else [],
        )
        for path in scenario_files()
    ]


@pytest.mark.parametrize("path", scenarios())
async def test_scenario(path: Path, home: Path, project: Path) -> None:
    service = await ServiceProcess.start(home, project)
    try:
        await run_scenario(path, service)
    finally:
        await service.stop()
