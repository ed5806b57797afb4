"""Every conformance scenario, driven through the real service process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.fixture_runner import run_scenario, scenario_files
from tests.support.service import ServiceProcess

# The v1 contract holds in both modes.
pytestmark = pytest.mark.both_modes


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
async def test_scenario(path: Path, home: Path, project: Path) -> None:
    service = await ServiceProcess.start(home, project)
    try:
        await run_scenario(path, service)
    finally:
        await service.stop()
