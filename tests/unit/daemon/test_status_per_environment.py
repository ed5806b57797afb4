"""One daemon core, clients launched with different environments: each gets its own
``status.provider_auth_ready``, however the requests interleave (the readiness answer is
remembered per launch environment, never shared across different ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from tests.support.inprocess import in_memory_daemon
from tests.support.service import service_env

from magi_code.auth.store import AuthStore
from magi_code.client import Channel, Client
from magi_code.daemon import memory
from magi_code.daemon.server import DaemonServer
from magi_code.storage.launch import LaunchContext


async def _client(server: DaemonServer, ctx: LaunchContext) -> Client:
    reader, writer = memory.connect(server)
    channel = await Channel.handshake(
        cast(asyncio.StreamReader, reader),
        cast(asyncio.StreamWriter, writer),
        "persistent",
        ctx,
    )
    client = Client(channel)
    answer = await client.request("initialize", {"supported_protocol_versions": [1]})
    assert answer["error"] is None, answer
    return client


async def _ready(client: Client) -> bool:
    response = await client.request("status")
    assert response["error"] is None, response
    ready: bool = response["payload"]["provider_auth_ready"]
    return ready


async def test_clients_with_different_environments_get_their_own_answers(
    home: Path, project: Path
) -> None:
    async with in_memory_daemon(home, project) as daemon:
        plain = LaunchContext(home, project, service_env(home))
        keyed = LaunchContext(home, project, service_env(home, {"ANTHROPIC_API_KEY": "sk-env"}))
        other = LaunchContext(home, project, service_env(home, {"MC_PROVIDER": "openai-codex"}))
        clients = [await _client(daemon.server, ctx) for ctx in (plain, keyed, other)]
        try:
            for _ in range(3):
                assert [await _ready(c) for c in clients] == [False, True, False]
            # A key stored in the shared store: only the plain client's answer changes
            # (the keyed one is ready either way, the Codex one needs a Codex login).
            AuthStore(home / "auth.json").commit("anthropic", {"type": "api_key", "key": "k"}, None)
            for _ in range(3):
                assert [await _ready(c) for c in clients] == [True, True, False]
        finally:
            for client in clients:
                await client.close()
