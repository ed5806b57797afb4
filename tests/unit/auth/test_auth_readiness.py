from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.unit.auth.auth_helpers import make_ctx

from magi_code.auth.readiness import is_ready, provider_status
from magi_code.auth.store import AuthSnapshot, AuthStore

NOW = 1_800_000_000.0
KEYS = ["auth_method", "provider_id", "readiness", "ready", "source"]


@dataclass(frozen=True)
class Provider:
    provider_id: str
    api_key_env: str | None = None
    api: str = "openai-chat"


def _snapshot(**records: dict[str, Any]) -> AuthSnapshot:
    return AuthSnapshot(records=records, generations=dict.fromkeys(records, 1))


def _oauth(**fields: Any) -> dict[str, Any]:
    return {"type": "oauth", "access_token": "a", "refresh_token": None, **fields}


def _by_id(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["provider_id"]: entry for entry in entries}


def test_empty_store_reports_builtins_then_sorted_custom_providers(home: Path) -> None:
    providers = [Provider("zeta", "ZETA_KEY"), Provider("alpha"), Provider("anthropic", "X")]
    entries = provider_status(make_ctx(home), providers, AuthSnapshot(), NOW)
    assert [e["provider_id"] for e in entries] == ["openai-codex", "anthropic", "alpha", "zeta"]
    assert all(sorted(e) == KEYS for e in entries)
    assert entries == [
        {"provider_id": "openai-codex", "auth_method": "oauth", "source": "shared_store",
         "readiness": "missing", "ready": False},
        {"provider_id": "anthropic", "auth_method": "api_key", "source": "shared_store",
         "readiness": "missing", "ready": False},
        {"provider_id": "alpha", "auth_method": "none", "source": "none",
         "readiness": "ready", "ready": True},
        {"provider_id": "zeta", "auth_method": "api_key", "source": "environment",
         "readiness": "missing", "ready": False},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "readiness"),
    [
        (_oauth(refresh_token="r", expires_at=int(NOW) - 10), "ready"),  # refreshable
        (_oauth(expires_at=int(NOW) + 600), "ready"),
        (_oauth(), "ready"),  # unknown expiry: usable until the provider says otherwise
        (_oauth(expires_at=int(NOW) - 10), "needs_login"),
        ({"type": "api_key", "key": "k"}, "needs_login"),
        ({"type": "oauth", "access_token": "", "refresh_token": ""}, "needs_login"),
    ],
)
def test_codex_readiness(home: Path, record: dict[str, Any], readiness: str) -> None:
    snapshot = _snapshot(**{"openai-codex": record})
    entry = _by_id(provider_status(make_ctx(home), [], snapshot, NOW))["openai-codex"]
    assert (entry["source"], entry["readiness"], entry["ready"]) == (
        "shared_store",
        readiness,
        readiness == "ready",
    )
    assert is_ready(make_ctx(home), "openai-codex", snapshot, NOW) is (readiness == "ready")


def test_anthropic_prefers_nonempty_environment_key(home: Path) -> None:
    snapshot = _snapshot(anthropic={"type": "api_key", "key": "stored"})
    ctx = make_ctx(home, ANTHROPIC_API_KEY="env-key")
    entry = _by_id(provider_status(ctx, [], snapshot, NOW))["anthropic"]
    assert (entry["auth_method"], entry["source"], entry["readiness"]) == (
        "api_key",
        "environment",
        "ready",
    )
    # Environment readiness survives a local logout.
    assert is_ready(ctx, "anthropic", AuthSnapshot(), NOW) is True


@pytest.mark.parametrize("env_value", ["", "   "])
def test_anthropic_blank_environment_falls_back_to_the_store(home: Path, env_value: str) -> None:
    ctx = make_ctx(home, ANTHROPIC_API_KEY=env_value)
    stored = _snapshot(anthropic={"type": "api_key", "key": "stored"})
    entry = _by_id(provider_status(ctx, [], stored, NOW))["anthropic"]
    assert (entry["source"], entry["readiness"]) == ("shared_store", "ready")
    bad = _snapshot(anthropic={"type": "api_key", "key": ""})
    entry = _by_id(provider_status(ctx, [], bad, NOW))["anthropic"]
    assert (entry["source"], entry["readiness"], entry["ready"]) == (
        "shared_store",
        "needs_login",
        False,
    )


def test_custom_providers_follow_their_environment_variable(home: Path) -> None:
    provider = Provider("local", "LOCAL_KEY")
    assert not is_ready(make_ctx(home), provider, AuthSnapshot(), NOW)
    ready_ctx = make_ctx(home, LOCAL_KEY="secret")
    assert is_ready(ready_ctx, provider, AuthSnapshot(), NOW)
    entry = _by_id(provider_status(ready_ctx, [provider], AuthSnapshot(), NOW))["local"]
    assert entry == {
        "provider_id": "local",
        "auth_method": "api_key",
        "source": "environment",
        "readiness": "ready",
        "ready": True,
    }
    assert "secret" not in json.dumps(entry) and "LOCAL_KEY" not in json.dumps(entry)


def test_unknown_provider_ids_are_not_ready(home: Path) -> None:
    assert is_ready(make_ctx(home), "nobody", AuthSnapshot(), NOW) is False


def test_status_reads_do_not_create_or_modify_the_store(store: AuthStore, home: Path) -> None:
    provider_status(make_ctx(home), [], store.read(), NOW)
    assert not (home / "auth.json").exists()
    store.commit("anthropic", {"type": "api_key", "key": "k"}, None)
    before = (home / "auth.json").stat()
    provider_status(make_ctx(home), [], store.read(), NOW)
    after = (home / "auth.json").stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
