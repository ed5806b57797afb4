"""Auth, sessions and configuration answer identically over a persistent v2 connection
and through the v1 shim (issues 6 and 7: "identically over v1 (both modes) and v2")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from magi_code.protocol.limits import MAX_SESSION_LIST_SCAN_ENTRIES
from tests.process.daemon.support import persistent
from tests.process.test_sessions import fill_sessions_directory
from tests.support.fake_oauth import FakeOAuthIssuer
from tests.support.service import running_service

ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("status", {}),
    ("auth.status", {}),
    ("auth.logout", {"provider_id": "anthropic"}),
    ("auth.logout", {"provider_id": "nobody", "confirmed": True}),
    ("catalog.providers", {"limit": 1}),
    ("catalog.models", {"provider_id": "anthropic"}),
    ("config.get", {}),
    ("config.set", {"scope": "project", "fast": True}),
    ("session.list", {}),
    ("turn.cancel", {"turn_id": "turn_unknown"}),
]


def _comparable(response: dict[str, Any]) -> dict[str, Any]:
    return {"payload": response["payload"], "error": response["error"]}


async def test_v1_routes_answer_the_same_over_v2_and_the_shim(home: Path, project: Path) -> None:
    (home / "settings.json").write_text(json.dumps({"model": "claude-x"}))
    env = {"ANTHROPIC_API_KEY": "sk-ant-distinctive-0000"}
    client = await persistent(home, project, **env)
    try:
        over_v2 = [_comparable(await client.request(m, p)) for m, p in ROUTES]
    finally:
        await client.close()
    async with running_service(home, project, env) as shim:
        over_v1 = [_comparable(await shim.request(m, p)) for m, p in ROUTES]
    assert over_v2 == over_v1
    assert over_v1[0]["payload"] == {"service": "ready", "provider_auth_ready": True}
    assert "sk-ant-distinctive" not in json.dumps(over_v2)


async def test_login_over_v2_is_cancelled_only_with_its_own_connection(
    home: Path, project: Path
) -> None:
    with FakeOAuthIssuer() as issuer:
        env = {"MC_CODEX_AUTH_ISSUER": issuer.url, "MC_OAUTH_CALLBACK_PORT": "0"}
        owner = await persistent(home, project, **env)
        other = await persistent(home, project, **env)
        try:
            started = await owner.request("auth.login.start", {"provider_id": "openai-codex"})
            assert started["payload"]["status"] == "started"
            busy = await other.request("auth.login.start", {"provider_id": "openai-codex"})
            assert busy["error"]["code"] == "auth_busy"
            await owner.close()
            # The owner's loss cancels its login; the other connection can start one.
            for _ in range(50):
                retry = await other.request("auth.login.start", {"provider_id": "openai-codex"})
                if retry["error"] is None:
                    break
                assert retry["error"]["code"] == "auth_busy"
                await asyncio.sleep(0.05)
            assert retry["error"] is None
            cancelled = await other.request(
                "auth.login.cancel", {"login_id": retry["payload"]["login_id"]}
            )
            assert cancelled["payload"]["status"] == "cancellation_requested"
        finally:
            await other.close()


async def test_past_the_scan_budget_v2_pages_with_incomplete_and_v1_fails(
    home: Path, project: Path
) -> None:
    """One daemon, one directory over the list scan budget: a persistent client pages
    through the examined entries (``incomplete``); the v1 shim gets ``limit_exceeded``."""
    client = await persistent(home, project)
    try:
        created = await client.request("session.create", {})  # the directory exists
        assert created["error"] is None, created
        fill_sessions_directory(home, MAX_SESSION_LIST_SCAN_ENTRIES)
        page = await client.request("session.list", {})
        assert page["error"] is None, page
        assert page["payload"]["incomplete"] is True
        async with running_service(home, project) as shim:
            over = await shim.request("session.list")
        assert over["error"]["code"] == "limit_exceeded"
    finally:
        await client.close()
