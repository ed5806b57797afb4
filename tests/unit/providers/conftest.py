"""Fixtures for provider tests: a loopback fake provider and an httpx client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from tests.support.fake_providers import FakeProviderServer


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as server:
        yield server


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http
