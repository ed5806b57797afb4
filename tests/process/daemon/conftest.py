"""Daemon process tests: always daemon mode; every daemon started here is stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import service


@pytest.fixture(autouse=True)
def service_mode(tmp_path: Path) -> Iterator[str]:
    service.set_mode("daemon")
    try:
        yield "daemon"
    finally:
        service.set_mode(service.DEFAULT_MODE)
        service.stop_daemons(tmp_path)
