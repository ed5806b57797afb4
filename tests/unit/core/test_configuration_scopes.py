"""Configuration work is per connection and per written file, never one worker for all.

Two connections of one coordinator (as the daemon has): a connection that never lets
its answers be written holds up only itself; overlapping writes of one file are
``configuration_busy``, writes of different files are not; a connection's close waits
for its own request only.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import magi_code.core.configuration as configuration
from magi_code.composition import build_coordinator
from magi_code.core.coordinator import Connection, ServiceCoordinator
from magi_code.core.output import Batch
from magi_code.protocol import envelope
from magi_code.storage.launch import LaunchContext
from tests.support.fake_providers import FakeModel, FakeProviderServer


async def _listings_received(fake: FakeProviderServer, count: int) -> None:
    """Until the fake has taken ``count`` model listings (held while it is closed)."""
    async with asyncio.timeout(10):
        while sum(r.path.endswith("/models") for r in fake.requests) < count:
            await asyncio.sleep(0.01)


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as server:
        server.models = [FakeModel("m1"), FakeModel("m2")]
        yield server


@pytest.fixture
async def coordinator(tmp_path: Path, fake: FakeProviderServer) -> AsyncIterator[Any]:
    home = tmp_path / "home"
    home.mkdir()
    providers = {
        name: {"api": "openai-chat", "base_url": f"{fake.base_url}/v1"} for name in ("a", "b")
    }
    (home / "settings.json").write_text(json.dumps({"providers": providers}))
    yield await build_coordinator(LaunchContext(home, tmp_path, {}))


class Client:
    """One connection whose answers are written only when ``read`` takes them."""

    def __init__(self, coordinator: ServiceCoordinator, home: Path, project: Path) -> None:
        project.mkdir(exist_ok=True)
        self.coordinator = coordinator
        self.conn: Connection = coordinator.open_connection(LaunchContext(home, project, {}))
        self.ids = iter(range(1, 10_000))
        self.unread: list[Batch] = []

    async def send(self, method: str, payload: dict[str, Any] | None = None) -> str:
        rid = f"r{next(self.ids)}"
        record = orjson.dumps(envelope.request(rid, method, payload or {}))
        await self.coordinator.handle_record(self.conn, record)
        return rid

    async def answer(self, rid: str, *, write: bool = True, timeout: float = 10.0) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                for batch in self.unread:
                    message = batch.messages[0]
                    if message.get("request_id") == rid and message["kind"] == "response":
                        self.unread.remove(batch)
                        if write:
                            batch.written()
                        return message
                batch = await self.conn.output.get()
                assert batch is not None
                self.unread.append(batch)

    async def request(self, method: str, payload: dict[str, Any] | None = None) -> Any:
        return await self.answer(await self.send(method, payload))

    async def initialize(self) -> None:
        response = await self.request("initialize", {"supported_protocol_versions": [1]})
        assert response["error"] is None


def _code(response: dict[str, Any]) -> str | None:
    error = response["error"]
    return None if error is None else str(error["code"])


@pytest.fixture
async def clients(coordinator: ServiceCoordinator, tmp_path: Path) -> tuple[Client, Client]:
    home = tmp_path / "home"
    a, b = Client(coordinator, home, tmp_path / "pa"), Client(coordinator, home, tmp_path / "pb")
    await a.initialize()
    await b.initialize()
    return a, b


async def test_unwritten_answers_hold_up_only_their_own_connection(
    clients: tuple[Client, Client],
) -> None:
    a, b = clients
    # A never lets its answers be written (its frontend stopped reading stdout).
    for _ in range(configuration.MAX_UNWRITTEN_ANSWERS):
        rid = await a.send("catalog.models", {"provider_id": "a"})
        assert _code(await a.answer(rid, write=False)) is None  # free once queued
    assert _code(await a.request("config.get")) == "configuration_busy"
    for _ in range(3):
        assert _code(await b.request("config.get")) is None
        assert _code(await b.request("catalog.providers")) is None


async def test_one_connection_one_request_and_one_refresh_per_provider_cache(
    clients: tuple[Client, Client], fake: FakeProviderServer
) -> None:
    a, b = clients
    gate = fake.listing_gate = threading.Event()  # the refresh stays in flight until it is opened
    slow = await a.send("catalog.refresh", {"provider_id": "a"})
    await _listings_received(fake, 1)
    assert _code(await a.request("config.get")) == "configuration_busy"  # the v1 rule
    # Another connection: reads and other files go ahead, the same cache file is busy.
    assert _code(await b.request("config.get")) is None
    assert _code(await b.request("catalog.models", {"provider_id": "a"})) is None
    assert _code(await b.request("catalog.refresh", {"provider_id": "a"})) == "configuration_busy"
    assert _code(await b.request("config.set", {"scope": "global", "fast": True})) is None
    other = await b.send("catalog.refresh", {"provider_id": "b"})
    gate.set()
    assert (await a.answer(slow))["payload"]["state"] == "fresh_cache"
    assert (await b.answer(other))["payload"]["state"] == "fresh_cache"
    assert _code(await a.request("config.get")) is None


async def test_a_close_waits_only_for_its_own_request(
    coordinator: ServiceCoordinator, clients: tuple[Client, Client], fake: FakeProviderServer
) -> None:
    a, b = clients
    gate = fake.listing_gate = threading.Event()  # refreshes stay in flight until it is opened
    slow = await b.send("catalog.refresh", {"provider_id": "a"})
    await _listings_received(fake, 1)
    # A's close returns while B's refresh is still held.
    await asyncio.wait_for(coordinator.close_connection(a.conn), 10)
    gate.set()
    assert (await b.answer(slow))["payload"]["state"] == "fresh_cache"
    # Its own in-flight request is drained (never cancelled) before the close returns.
    gate = fake.listing_gate = threading.Event()
    own = await b.send("catalog.refresh", {"provider_id": "b"})
    await _listings_received(fake, 2)
    closing = asyncio.create_task(coordinator.close_connection(b.conn))
    await asyncio.sleep(0.2)  # room for a close that does not wait to return
    assert not closing.done()
    gate.set()
    await asyncio.wait_for(closing, 10)
    assert (await b.answer(own))["payload"]["state"] == "fresh_cache"


@pytest.fixture
def held_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Settings writes wait (in their worker thread) until the returned event is set."""
    write = configuration.apply_config_set
    writes_open = threading.Event()

    def held(ctx: LaunchContext, payload: dict[str, Any]) -> dict[str, Any]:
        writes_open.wait(10)
        return write(ctx, payload)

    monkeypatch.setattr(configuration, "apply_config_set", held)
    return writes_open


async def test_writes_of_one_settings_file_overlap_busy_other_files_not(
    coordinator: ServiceCoordinator,
    clients: tuple[Client, Client],
    held_writes: threading.Event,
    tmp_path: Path,
) -> None:
    a, b = clients
    assert _code(await a.request("catalog.refresh", {"provider_id": "a"})) is None
    fast = {"scope": "global", "fast": True}
    level = {"scope": "project", "selection": {"provider_id": "a", "model_id": "m1"}}
    first = await a.send("config.set", fast)
    assert _code(await b.request("config.set", fast)) == "configuration_busy"
    project_write = await b.send("config.set", level)  # B's own project file
    held_writes.set()
    assert _code(await a.answer(first)) is None
    assert _code(await b.answer(project_write)) is None
    # Two connections in one project share its file.
    held_writes.clear()
    c = Client(coordinator, tmp_path / "home", tmp_path / "pb")
    await c.initialize()
    again = await b.send("config.set", level)
    assert _code(await c.request("config.set", level)) == "configuration_busy"
    held_writes.set()
    assert _code(await c.request("config.set", fast)) is None
    assert _code(await b.answer(again)) is None
    assert (tmp_path / "pb" / ".magi-code" / "settings.json").is_file()
