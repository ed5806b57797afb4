"""CLI commands as a terminal user runs them: real processes, a temporary MC_HOME, and
the daemon of any test that started one stopped at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import service


@pytest.fixture(autouse=True)
def stop_daemons(tmp_path: Path) -> Iterator[None]:
    yield
    service.stop_daemons(tmp_path)
