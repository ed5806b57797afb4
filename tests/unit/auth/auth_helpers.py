"""Helpers shared by the auth tests (imported by module path, not via conftest)."""

from __future__ import annotations

import asyncio
import http.client
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from magi_code.storage.launch import LaunchContext

WAIT_S = 10.0


def make_ctx(home: Path, **env: str) -> LaunchContext:
    return LaunchContext(mc_home=home, project_dir=home.parent, env=dict(env))


class Events:
    """Collects ``emit`` calls from a login and lets a test await them in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    def emit(self, state: str, extra: dict[str, Any]) -> None:
        self.seen.append((state, dict(extra)))
        self._queue.put_nowait((state, dict(extra)))

    async def expect(self, state: str) -> dict[str, Any]:
        got, extra = await asyncio.wait_for(self._queue.get(), WAIT_S)
        assert got == state
        return extra

    @property
    def states(self) -> list[str]:
        return [state for state, _ in self.seen]


def _get(url: str) -> tuple[int, str | None, str]:
    parts = urlsplit(url)
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
    conn = http.client.HTTPConnection(host or "127.0.0.1", parts.port, timeout=WAIT_S)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target)
        response = conn.getresponse()
        return response.status, response.getheader("Location"), response.read().decode()
    finally:
        conn.close()


async def browser_get(url: str) -> tuple[int, str | None, str]:
    """A "browser" GET without redirects (stdlib, so it logs nothing): status, Location, body.

    ``localhost`` is dialled as 127.0.0.1, which is where the listener binds.
    """
    return await asyncio.to_thread(_get, url)
