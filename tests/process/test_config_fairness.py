"""No head-of-line blocking between frontends' configuration work, through real service
processes: both frontends are shims of one daemon (in embedded mode they would be separate
services sharing one MC_HOME, where it holds trivially: run in the default mode only).

- Frontend A asks for large catalog pages and never reads its stdout: its pipe fills,
  its answers stay unwritten; frontend B's ``config.get`` still answers at once.
- Frontend A's EOF does not wait for frontend B's slow ``catalog.refresh``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.protocol import envelope
from tests.support.fake_providers import FakeModel, FakeProviderServer
from tests.support.service import ServiceProcess, current_mode, running_service, service_env

PAGES = 48


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as server:
        # Long IDs and labels: one catalog.models page is about 15 KB.
        server.models = [
            FakeModel(f"model-{i:04d}-" + "a" * 200, "Label " * 30) for i in range(1000)
        ]
        yield server


def _settings(home: Path, fake: FakeProviderServer) -> None:
    provider = {"api": "openai-chat", "base_url": f"{fake.base_url}/v1"}
    (home / "settings.json").write_text(json.dumps({"providers": {"local": provider}}))


class Unread:
    """A real service process whose stdout is a pipe nobody reads (until ``drain``)."""

    def __init__(self, service: ServiceProcess, read_fd: int) -> None:
        self.service = service
        self.read_fd = read_fd
        self.output = bytearray()
        self._reader: threading.Thread | None = None

    @classmethod
    async def start(cls, home: Path, project: Path) -> Unread:
        read_fd, write_fd = os.pipe()
        with contextlib.suppress(AttributeError, OSError):
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 4096)  # fills sooner (Linux)
        try:
            with (home.parent / "a-stderr.txt").open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "magi_code",
                    "--app",
                    "service",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=write_fd,
                    stderr=stderr,
                    cwd=project,
                    env=service_env(home),
                )
        finally:
            os.close(write_fd)
        return cls(ServiceProcess(proc, home, current_mode()), read_fd)

    def buffered(self) -> int:
        """Bytes written to the pipe and not read."""
        size = bytearray(4)
        fcntl.ioctl(self.read_fd, termios.FIONREAD, size)
        return int.from_bytes(size, sys.byteorder)

    async def send(self, request_id: str, method: str, payload: dict[str, Any]) -> None:
        await self.service.send(envelope.request(request_id, method, payload))

    def drain(self) -> None:
        def read() -> None:
            while chunk := os.read(self.read_fd, 1 << 16):
                self.output += chunk

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    async def stop(self, expected: int) -> list[dict[str, Any]]:
        """Read everything, wait for ``expected`` answers, then end the process."""
        if self._reader is None:
            self.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # All answers are read before stdin closes: what a service writes after its EOF
        # is not what this test is about.
        while bytes(self.output).count(b"\n") < expected and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await self.service.stop()
        assert self._reader is not None
        await asyncio.to_thread(self._reader.join, 10)
        os.close(self.read_fd)
        return [orjson.loads(line) for line in bytes(self.output).splitlines() if line]


async def test_a_frontend_that_stops_reading_holds_up_no_other_frontend(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    _settings(home, fake)
    async with running_service(home, project) as b:
        refreshed = await b.request("catalog.refresh", {"provider_id": "local"})
        assert refreshed["payload"]["state"] == "fresh_cache"
        a = await Unread.start(home, project)
        try:
            await a.send("init", "initialize", {"supported_protocol_versions": [1]})
            for page in range(PAGES):
                payload = {"provider_id": "local", "offset": 32 * (page % 31), "limit": 32}
                await a.send(f"page-{page}", "catalog.models", payload)
                await asyncio.sleep(0.03)  # one at a time, mostly (A reads nothing)
            await a.send("get", "config.get", {})
            await asyncio.sleep(0.1)
            await a.send("refresh", "catalog.refresh", {"provider_id": "local"})
            # Far more than the pipe holds was answered: A's output is stuck (nobody reads
            # it, so the buffered amount only grows, and it stops growing when full).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            seen = -1
            while (now := a.buffered()) != seen or now == 0:
                assert loop.time() < deadline, (now, (home.parent / "a-stderr.txt").read_text())
                seen = now
                await asyncio.sleep(0.5)
            for _ in range(5):
                answer = await b.request("config.get", timeout=5)
                assert answer["error"] is None, answer
                models = await b.request("catalog.models", {"provider_id": "local"}, timeout=5)
                assert models["error"] is None, models
                await asyncio.sleep(0.1)
            assert a.buffered() == seen  # A was stuck all along
        finally:
            messages = await a.stop(expected=PAGES + 3)
    answers = {m["request_id"]: m for m in messages if m["kind"] == "response"}
    assert len(answers) == PAGES + 3, sorted(answers)
    assert answers["init"]["error"] is None
    # Requests overlapping A's own unwritten backlog are busy for A (and only for A).
    own = [answers[rid] for rid in ("get", "refresh", *(f"page-{p}" for p in range(PAGES)))]
    assert all(m["error"] is None or m["error"]["code"] == "configuration_busy" for m in own)
    pages = [m for m in own[2:] if m["error"] is None]
    assert len(pages) >= 1 and all(len(p["payload"]["entries"]) == 32 for p in pages)


async def test_a_frontends_eof_does_not_wait_for_another_frontends_slow_refresh(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    _settings(home, fake)
    async with running_service(home, project) as b, running_service(home, project) as a:
        # The provider holds every model listing until the test releases it.
        fake.listing_gate = threading.Event()
        await b.send(envelope.request("slow", "catalog.refresh", {"provider_id": "local"}))
        await _listings_reach(fake, 0)
        await a.close_stdin()
        assert await a.drain_stdout(timeout=10) == []
        # A ended while B's refresh is still held at the provider.
        assert await a.wait(timeout=10) == 0
        fake.listing_gate.set()
        refreshed = await b.response_for("slow", timeout=20)
        assert refreshed["payload"] == {"provider_id": "local", "state": "fresh_cache"}
        # B's own EOF waits for B's own refresh: it is drained, not cancelled.
        fake.listing_gate = threading.Event()
        listed = _listings(fake)
        await b.send(envelope.request("own", "catalog.refresh", {"provider_id": "local"}))
        await _listings_reach(fake, listed)
        await b.close_stdin()
        await asyncio.sleep(0.5)  # B reads its EOF while its refresh is held
        fake.listing_gate.set()
        rest = await b.drain_stdout(timeout=20)
        assert [m["request_id"] for m in rest if m["kind"] == "response"] == ["own"]
        assert rest[-1]["payload"]["state"] == "fresh_cache"


def _listings(fake: FakeProviderServer) -> int:
    return sum(r.path == "/v1/models" for r in fake.requests)


async def _listings_reach(fake: FakeProviderServer, listed: int) -> None:
    """Until a model listing after the first ``listed`` reached the provider."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while _listings(fake) <= listed:
        assert loop.time() < deadline, "the refresh never reached the provider"
        await asyncio.sleep(0.05)
