"""``status.provider_auth_ready`` through the real service never answers from stale files.

The service remembers the readiness answer while the settings files and the auth store
keep their stamps; these tests change those files from this process (as an editor or
``magi-code login`` in another terminal would) between two ``status`` requests and expect
the next answer to follow. The first test waits until its files are older than the stamps'
racy window, so the service really answers from memory before each change.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from magi_code.auth.store import AuthStore
from magi_code.storage.files import atomic_write
from magi_code.storage.stamps import RACY_WINDOW_NS
from tests.support.service import ServiceProcess, running_service

# The same size: a custom provider without auth (ready), then one that is not defined.
READY = {"provider": "pa", "providers": {"pa": {"api": "openai-chat", "base_url": "http://x"}}}
NOT_READY = {**READY, "provider": "pb"}
OLD_NS = 1_600_000_000 * 10**9


async def _ready(service: ServiceProcess) -> bool:
    response = await service.request("status")
    assert response["error"] is None, response
    ready: bool = response["payload"]["provider_auth_ready"]
    return ready


async def test_status_follows_changes_made_by_other_processes(home: Path, project: Path) -> None:
    settings = home / "settings.json"
    settings.write_text(json.dumps(READY))
    os.utime(settings, ns=(OLD_NS, OLD_NS))
    written = time.monotonic()
    async with running_service(home, project) as service:
        # Past the racy window, the stamps vouch for the file: answers come from memory.
        await asyncio.sleep(max(0.0, RACY_WINDOW_NS / 1e9 + 0.2 - (time.monotonic() - written)))
        assert await _ready(service) is True
        assert await _ready(service) is True

        # An in-place rewrite of the same size, its modification time put back.
        before = os.stat(settings)
        with open(settings, "r+b") as fh:
            fh.write(json.dumps(NOT_READY).encode())
        os.utime(settings, ns=(OLD_NS, OLD_NS))
        after = os.stat(settings)
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        )
        assert await _ready(service) is False

        # An editor's save: a new file renamed over the old one.
        atomic_write(settings, json.dumps(READY).encode())
        assert await _ready(service) is True

        # Deleted: the built-in default (anthropic) without a key.
        settings.unlink()
        assert await _ready(service) is False

        # `magi-code login` elsewhere stores a key, then `magi-code logout` removes it.
        store = AuthStore(home / "auth.json")
        store.commit("anthropic", {"type": "api_key", "key": "sk-test"}, None)
        assert await _ready(service) is True
        assert store.remove("anthropic")
        assert await _ready(service) is False


async def test_repeated_status_within_one_second_follows_same_size_rewrites(
    home: Path, project: Path
) -> None:
    settings = home / "settings.json"
    async with running_service(home, project) as service:
        for document, expected in [(READY, True), (NOT_READY, False)] * 3:
            settings.write_text(json.dumps(document))
            assert await _ready(service) is expected
            assert await _ready(service) is expected


# Both modes: one process per environment (embedded), one daemon for all (daemon).
@pytest.mark.both_modes
async def test_status_of_clients_with_different_environments(home: Path, project: Path) -> None:
    # Through the daemon both frontends share one core; each keeps its own environment.
    async with (
        running_service(home, project) as without_key,
        running_service(home, project, {"ANTHROPIC_API_KEY": "sk-env"}) as with_key,
    ):
        for _ in range(3):
            assert await _ready(without_key) is False
            assert await _ready(with_key) is True
