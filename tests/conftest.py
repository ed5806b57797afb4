"""Shared fixtures: every test gets its own MC_HOME and project directory."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.fake_providers import FakeProviderServer
from tests.support.modes import runs_in_this_mode
from tests.support.service import ServiceProcess, running_service

# Property tests judge behaviour, never speed: a loaded machine (the suite runs on all
# cores beside real daemons) must not fail an example for taking long.
settings.register_profile("magi-code", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("magi-code")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The mode matrix runs an unmarked test in the product's mode only (tests/support/modes.py).
    items[:] = [item for item in items if runs_in_this_mode(item)]


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        # A developer's proxy or CA settings must not route loopback test traffic.
        proxyish = name.upper().endswith("_PROXY") or name.upper().startswith("SSL_CERT_")
        if name.startswith(("MC_", "ANTHROPIC_", "OPENAI_")) or proxyish:
            monkeypatch.delenv(name)
    user_home = tmp_path / "user-home"
    user_home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(user_home))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "mc-home"
    path.mkdir()
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    """A loopback provider speaking the providers' SSE formats (tests/support)."""
    with FakeProviderServer() as server:
        yield server


@pytest.fixture
async def service(home: Path, project: Path) -> AsyncIterator[ServiceProcess]:
    async with running_service(home, project) as svc:
        yield svc


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    """FIFOs a test plants; at teardown each gets a peer, so an opener stuck by a
    regression ends instead of hanging the suite."""
    planted: list[Path] = []
    yield planted
    for path in planted:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            continue
        os.close(fd)
