"""Fixtures for provider tests: a loopback fake provider and the service's httpx client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from magi_code.providers.http import DIRECT, build_client


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The client the service builds for a direct route."""
    async with build_client(DIRECT) as http:
        yield http
