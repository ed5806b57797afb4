"""Fixtures of the in-memory daemon tests: a loopback fake provider, and a daemon whose
home selects it (a module may define its own ``daemon``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer
from tests.support.inprocess import InMemoryDaemon, in_memory_daemon


@pytest.fixture
async def daemon(
    home: Path, project: Path, fake: FakeProviderServer
) -> AsyncIterator[InMemoryDaemon]:
    write_settings(home, fake)
    async with in_memory_daemon(home, project) as running:
        yield running
