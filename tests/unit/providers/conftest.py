"""Fixtures for provider tests: a loopback fake provider and httpx clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from tests.support.fake_providers import FakeProviderServer

from magi_code.providers.http import DIRECT, build_client


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as server:
        yield server


@pytest.fixture(params=["service", "httpx"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    """The service's own client (direct routes: ``providers.transport``) and one with
    httpx's default transport (what a proxied route uses)."""
    made = build_client(DIRECT) if request.param == "service" else httpx.AsyncClient()
    async with made as http:
        yield http
