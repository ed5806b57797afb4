from __future__ import annotations

import http.client
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.fake_oauth import CLIENT_ID
from tests.unit.auth.auth_helpers import make_ctx

from magi_code.auth.operations import auth_status, logout
from magi_code.auth.store import AuthStore
from magi_code.protocol.errors import ErrorCode, ServiceError


@dataclass(frozen=True)
class Provider:
    provider_id: str
    api_key_env: str | None = None


def test_logout_removes_only_that_record_and_reports_it(store: AuthStore) -> None:
    store.commit("anthropic", {"type": "api_key", "key": "k"}, None)
    store.commit("openai-codex", {"type": "oauth", "access_token": "a"}, None)
    assert logout(store, "anthropic", True, []) == {
        "provider_id": "anthropic",
        "status": "logged_out",
        "removed": True,
        "environment_unchanged": True,
    }
    snapshot = store.read()
    assert snapshot.record("anthropic") is None
    assert snapshot.generation("anthropic") == 2
    assert snapshot.record("openai-codex") is not None
    again = logout(store, "anthropic", True, [])
    assert again["removed"] is False
    assert store.read().generation("anthropic") == 3


@pytest.mark.parametrize("confirmed", [False, None, 1, "true"])
def test_logout_requires_explicit_confirmation(store: AuthStore, confirmed: object) -> None:
    with pytest.raises(ServiceError) as info:
        logout(store, "openai-codex", confirmed, [])  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.CONFIRMATION_REQUIRED
    assert store.read().generation("openai-codex") == 0


def test_logout_of_unknown_provider_is_unavailable(store: AuthStore) -> None:
    with pytest.raises(ServiceError) as info:
        logout(store, "nobody", True, [Provider("local")])
    assert info.value.code is ErrorCode.PROVIDER_UNAVAILABLE
    assert logout(store, "local", True, [Provider("local")])["removed"] is False


def test_logout_keeps_environment_backed_readiness(store: AuthStore, home: Path) -> None:
    store.commit("anthropic", {"type": "api_key", "key": "k"}, None)
    logout(store, "anthropic", True, [])
    ctx = make_ctx(home, ANTHROPIC_API_KEY="env")
    entries = auth_status(ctx, [], store)["providers"]
    assert entries[1]["provider_id"] == "anthropic" and entries[1]["ready"] is True


def test_auth_status_on_damaged_store_is_internal_error(store: AuthStore, home: Path) -> None:
    (home / "auth.json").write_bytes(b"{")
    (home / "auth.json").chmod(0o600)
    with pytest.raises(ServiceError) as info:
        auth_status(make_ctx(home), [], store)
    assert info.value.code is ErrorCode.INTERNAL_ERROR


def test_fake_issuer_runs_as_a_subprocess() -> None:
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_oauth"],
        cwd=root,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        query = (
            f"client_id={CLIENT_ID}&code_challenge=abc&code_challenge_method=S256"
            "&redirect_uri=http%3A%2F%2Flocalhost%3A1455%2Fauth%2Fcallback&state=s1"
        )
        conn.request("GET", f"/oauth/authorize?{query}")
        response = conn.getresponse()
        assert response.status == 302
        assert response.getheader("Location", "").startswith(
            "http://localhost:1455/auth/callback?code="
        )
        conn.close()
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
