from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.fake_oauth import CLIENT_ID, FakeOAuthIssuer
from tests.unit.auth.auth_helpers import make_ctx

from magi_code.auth.credentials import CredentialsError, resolve_headers
from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import codex_record


@dataclass(frozen=True)
class Provider:
    provider_id: str
    api_key_env: str | None = None
    api: str = "openai-chat"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


def _seed_codex(store: AuthStore, issuer: FakeOAuthIssuer, expired: bool) -> dict[str, Any]:
    issuer.access_ttl = -600 if expired else 3600
    record = codex_record(issuer.mint_tokens(), time.time())
    assert record is not None
    store.commit("openai-codex", record, None)
    issuer.access_ttl = 3600
    return record


def _token_calls(issuer: FakeOAuthIssuer) -> list[dict[str, str]]:
    return [r.params for r in issuer.requests if r.path == "/oauth/token"]


async def test_unexpired_codex_token_is_used_without_network(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    record = _seed_codex(store, issuer, expired=False)
    ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url)
    headers = await resolve_headers(ctx, "openai-codex", store, client)
    assert headers == {
        "Authorization": f"Bearer {record['access_token']}",
        "ChatGPT-Account-ID": issuer.account_id,
    }
    assert issuer.requests == []
    assert store.read().generation("openai-codex") == 1


async def test_expired_codex_token_is_refreshed_and_committed(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    old = _seed_codex(store, issuer, expired=True)
    ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url)
    headers = await resolve_headers(ctx, "openai-codex", store, client)
    calls = _token_calls(issuer)
    assert calls == [
        {
            "client_id": CLIENT_ID,
            "grant_type": "refresh_token",
            "refresh_token": old["refresh_token"],
        }
    ]
    assert issuer.requests[0].content_type.startswith("application/json")
    snapshot = store.read()
    new = snapshot.record("openai-codex")
    assert new is not None and snapshot.generation("openai-codex") == 2
    assert new["access_token"] != old["access_token"]
    assert new["refresh_token"] != old["refresh_token"]  # rotated token persisted
    assert new["refresh_token"] in issuer.live_refresh_tokens
    assert new["id_token"] == old["id_token"]  # omitted by the refresh response: kept
    assert new["expires_at"] > time.time()
    assert headers == {
        "Authorization": f"Bearer {new['access_token']}",
        "ChatGPT-Account-ID": issuer.account_id,
    }
    # A second call uses the stored token.
    assert await resolve_headers(ctx, "openai-codex", store, client) == headers
    assert len(_token_calls(issuer)) == 1


async def test_force_refresh_refreshes_a_valid_token(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    old = _seed_codex(store, issuer, expired=False)
    ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url)
    headers = await resolve_headers(ctx, "openai-codex", store, client, force_refresh=True)
    assert headers["Authorization"] != f"Bearer {old['access_token']}"
    assert store.read().generation("openai-codex") == 2


@pytest.mark.parametrize("failure", ["error", "revoked"])
async def test_refresh_failure_raises_a_fixed_label(
    home: Path,
    store: AuthStore,
    issuer: FakeOAuthIssuer,
    client: httpx.AsyncClient,
    failure: str,
) -> None:
    old = _seed_codex(store, issuer, expired=True)
    if failure == "error":
        issuer.mode = "error"
    else:
        issuer.live_refresh_tokens.clear()
    ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url)
    with pytest.raises(CredentialsError) as info:
        await resolve_headers(ctx, "openai-codex", store, client)
    assert info.value.label == "auth_refresh_failed"
    assert str(info.value) == "auth_refresh_failed"
    assert info.value.__cause__ is None and info.value.__context__ is None
    assert store.read().record("openai-codex") == old
    assert store.read().generation("openai-codex") == 1


async def test_refresh_racing_another_writer_uses_the_newer_record(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer
) -> None:
    _seed_codex(store, issuer, expired=True)
    newer = codex_record(issuer.mint_tokens(account_id="acct-other-writer"), time.time())
    assert newer is not None

    async def other_process_commits(response: httpx.Response) -> None:
        # Lands between our refresh response and our commit, like a concurrent login.
        if response.request.url.path == "/oauth/token":
            store.commit("openai-codex", newer, None)

    async with httpx.AsyncClient(event_hooks={"response": [other_process_commits]}) as client:
        ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url)
        headers = await resolve_headers(ctx, "openai-codex", store, client)
    assert headers == {
        "Authorization": f"Bearer {newer['access_token']}",
        "ChatGPT-Account-ID": "acct-other-writer",
    }
    assert store.read().record("openai-codex") == newer
    assert store.read().generation("openai-codex") == 2


async def test_codex_without_usable_credentials(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url)
    with pytest.raises(CredentialsError) as info:
        await resolve_headers(ctx, "openai-codex", store, client)
    assert info.value.label == "auth_missing"
    expired = {"type": "oauth", "access_token": "a", "refresh_token": None, "expires_at": 1}
    store.commit("openai-codex", expired, None)
    with pytest.raises(CredentialsError) as info:
        await resolve_headers(ctx, "openai-codex", store, client)
    assert info.value.label == "auth_missing"
    assert issuer.requests == []


async def test_unreadable_store_is_auth_unreadable(
    home: Path, store: AuthStore, client: httpx.AsyncClient
) -> None:
    (home / "auth.json").write_bytes(b"garbage")
    (home / "auth.json").chmod(0o600)
    for provider in ("openai-codex", "anthropic"):
        with pytest.raises(CredentialsError) as info:
            await resolve_headers(make_ctx(home), provider, store, client)
        assert info.value.label == "auth_unreadable"


async def test_anthropic_prefers_environment_then_store(
    home: Path, store: AuthStore, client: httpx.AsyncClient
) -> None:
    with pytest.raises(CredentialsError) as info:
        await resolve_headers(make_ctx(home), "anthropic", store, client)
    assert info.value.label == "auth_missing"
    store.commit("anthropic", {"type": "api_key", "key": "stored-key"}, None)
    assert await resolve_headers(
        make_ctx(home, ANTHROPIC_API_KEY=" "), "anthropic", store, client
    ) == {"x-api-key": "stored-key"}
    env_ctx = make_ctx(home, ANTHROPIC_API_KEY="env-key")
    assert await resolve_headers(env_ctx, "anthropic", store, client) == {"x-api-key": "env-key"}


async def test_custom_provider_headers(
    home: Path, store: AuthStore, client: httpx.AsyncClient
) -> None:
    ctx = make_ctx(home, LOCAL_KEY="local-secret")
    assert await resolve_headers(ctx, Provider("open"), store, client) == {}
    assert await resolve_headers(ctx, Provider("local", "LOCAL_KEY"), store, client) == {
        "Authorization": "Bearer local-secret"
    }
    compatible = Provider("claude-proxy", "LOCAL_KEY", api="anthropic")
    assert await resolve_headers(ctx, compatible, store, client) == {"x-api-key": "local-secret"}
    with pytest.raises(CredentialsError) as info:
        await resolve_headers(ctx, Provider("other", "UNSET_KEY"), store, client)
    assert info.value.label == "auth_missing"
