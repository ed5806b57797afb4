"""Every conformance scenario through the daemon's core in this process.

The same scenarios as ``test_fixtures.py``, bridged by the real shim code to the real
daemon roles and coordinator over the in-memory transport (no processes, no socket).
Every record the service writes must also validate against the ``v1`` bundle and the
exact per-payload JSON Schemas, and every request it answered successfully against the
bundle's request record. (The real process runs check the records they read the same way,
through ``ServiceProcess``.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.contract.fixture_runner import run_scenario, scenario_files
from tests.support import wire_schema
from tests.support.inprocess import V1Service, in_memory_daemon


@pytest.fixture
def service_mode() -> Iterator[str]:
    """Overrides the mode matrix: there is one mode here."""
    yield "in_memory"


class Recording:
    """A scenario service that keeps what was sent and received."""

    def __init__(self, inner: V1Service) -> None:
        self.inner = inner
        self.sent: list[Any] = []
        self.received: list[dict[str, Any]] = []

    async def send(self, record: Mapping[str, Any]) -> None:
        self.sent.append(record)
        await self.inner.send(record)

    async def send_raw(self, data: bytes) -> None:
        await self.inner.send_raw(data)

    async def close_stdin(self) -> None:
        await self.inner.close_stdin()

    async def recv(self, timeout: float = 20.0) -> dict[str, Any]:
        message = await self.inner.recv(timeout)
        self.received.append(message)
        return message

    async def wait(self, timeout: float = 20.0) -> int:
        return await self.inner.wait(timeout)


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
async def test_scenario_in_memory(path: Path, home: Path, project: Path) -> None:
    async with in_memory_daemon(home, project) as daemon:
        inner = await V1Service.start(daemon)
        service = Recording(inner)
        try:
            await run_scenario(path, service)
        finally:
            await inner.stop()
    assert service.received
    for record in service.received:
        wire_schema.check("v1", record)
        wire_schema.check_record(record)
    answered = {
        r["request_id"] for r in service.received if r["kind"] == "response" and r["error"] is None
    }
    for record in service.sent:
        if isinstance(record, dict) and record.get("request_id") in answered:
            wire_schema.check("v1", record)
