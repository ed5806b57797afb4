"""Auth through the real service: browser and manual Codex login, a Codex turn with the
stored token, logout, readiness, and no secret anywhere on the wire or on disk."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import codex_record
from tests.support.fake_oauth import FakeOAuthIssuer
from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.service import ServiceProcess, running_service

ACCOUNT = "acct-DISTINCTIVE-7731"


def _env(issuer: FakeOAuthIssuer, provider: FakeProviderServer | None = None) -> dict[str, str]:
    env = {"MC_CODEX_AUTH_ISSUER": issuer.url, "MC_OAUTH_CALLBACK_PORT": "0"}
    if provider is not None:
        env["MC_CODEX_BASE_URL"] = provider.base_url
    return env


async def _login_start(service: ServiceProcess) -> tuple[str, str, str]:
    started = await service.request("auth.login.start", {"provider_id": "openai-codex"})
    assert started["error"] is None, started
    assert started["payload"]["status"] == "started"
    login_id = started["payload"]["login_id"]
    first = await service.recv()
    assert first["event"] == "auth.login.progress"
    assert first["request_id"] == started["request_id"]
    assert first["session_id"] is None
    assert first["payload"]["state"] == "authorization_url"
    assert first["payload"]["open_browser"] is True
    waiting = await service.recv()
    assert waiting["payload"] == {
        "login_id": login_id,
        "provider_id": "openai-codex",
        "state": "waiting",
    }
    return started["request_id"], login_id, first["payload"]["url"]


async def _terminal(service: ServiceProcess, request_id: str) -> tuple[list[str], dict]:
    events = await service.events_until_terminal(request_id, terminal="auth.login.terminal")
    states = [e["payload"]["state"] for e in events]
    return states, events[-1]["payload"]


# Both modes: secrets could reach the service's stderr (embedded) or the daemon's log and files.
@pytest.mark.both_modes
async def test_browser_login_then_codex_turn_then_logout(home: Path, project: Path) -> None:
    with FakeOAuthIssuer(account_id=ACCOUNT) as issuer, FakeProviderServer() as provider:
        (home / "settings.json").write_text(json.dumps({"provider": "openai-codex"}))
        async with running_service(home, project, _env(issuer, provider)) as service:
            assert (await service.request("status"))["payload"]["provider_auth_ready"] is False
            request_id, login_id, url = await _login_start(service)
            # Play the browser: the issuer redirects to the loopback listener.
            async with httpx.AsyncClient(follow_redirects=True, timeout=10) as browser:
                landing = await browser.get(url)
            assert landing.status_code == 200
            states, terminal = await _terminal(service, request_id)
            assert states == ["callback_received", "callback_accepted", "exchange_succeeded"]
            assert terminal == {
                "login_id": login_id,
                "provider_id": "openai-codex",
                "state": "exchange_succeeded",
                "cleanup_complete": True,
            }
            status = await service.request("auth.status")
            codex = status["payload"]["providers"][0]
            assert codex == {
                "provider_id": "openai-codex",
                "auth_method": "oauth",
                "source": "shared_store",
                "readiness": "ready",
                "ready": True,
            }
            assert (await service.request("status"))["payload"]["provider_auth_ready"] is True

            provider.enqueue(Reply(text=["codex ", "says hi"]))
            turn = await service.request("turn.start", {"prompt": "hello"})
            events = await service.events_until_terminal(turn["request_id"])
            assert events[-1]["payload"]["status"] == "completed"
            assert events[-1]["payload"]["assistant_text"] == "codex says hi"
            sent = provider.requests[-1]
            assert sent.path.endswith("/responses")
            assert sent.headers["authorization"].startswith("Bearer ")
            assert sent.headers["chatgpt-account-id"] == ACCOUNT

            out = await service.request(
                "auth.logout", {"provider_id": "openai-codex", "confirmed": True}
            )
            assert out["payload"] == {
                "provider_id": "openai-codex",
                "status": "logged_out",
                "removed": True,
                "environment_unchanged": True,
            }
            assert (await service.request("status"))["payload"]["provider_auth_ready"] is False
            stdout_seen = json.dumps([*events, status, out])
        stderr = await service.stderr_text()
    tokens = [r for r in issuer.requests if r.path.endswith("/token")]
    secrets = [ACCOUNT, "fake-refresh", "fake-access", "code-fake"]
    for blob in (stdout_seen, stderr, *_home_files(home)):
        for secret in secrets:
            assert secret not in blob
    assert tokens  # the exchange really happened
    assert oct((home / "auth.json").stat().st_mode & 0o777) == "0o600"


def _home_files(home: Path) -> list[str]:
    """Every file under MC_HOME except the credential store: sessions, settings, catalog
    cache, and (in daemon mode) the daemon's log."""
    return [
        p.read_text(errors="replace")
        for p in home.rglob("*")
        if p.is_file() and p.name != "auth.json" and not p.name.endswith(".lock")
    ]


async def test_manual_callback_wrong_state_fails_and_is_never_echoed(
    home: Path, project: Path
) -> None:
    with FakeOAuthIssuer() as issuer:
        async with running_service(home, project, _env(issuer)) as service:
            request_id, login_id, _ = await _login_start(service)
            pasted = "http://localhost:1455/auth/callback?code=code-fake-PASTED&state=wrong"
            submitted = await service.request(
                "auth.login.callback", {"login_id": login_id, "input": pasted}
            )
            assert submitted["payload"] == {"login_id": login_id, "status": "submitted"}
            again = await service.request(
                "auth.login.callback", {"login_id": login_id, "input": pasted}
            )
            assert again["error"]["code"] in ("auth_busy", "unknown_login")
            states, terminal = await _terminal(service, request_id)
            assert states[-1] == "callback_failed"
            assert terminal["cleanup_complete"] is True
            assert "PASTED" not in json.dumps([submitted, again, terminal])
            late = await service.request(
                "auth.login.callback", {"login_id": login_id, "input": "x"}
            )
            assert late["error"]["code"] == "unknown_login"


# Both modes: EOF is the stdio adapter's (embedded) or the shim's.
@pytest.mark.both_modes
async def test_login_cancel_and_busy_and_eof(home: Path, project: Path) -> None:
    with FakeOAuthIssuer() as issuer:
        async with running_service(home, project, _env(issuer)) as service:
            request_id, login_id, _ = await _login_start(service)
            busy = await service.request("auth.login.start", {"provider_id": "openai-codex"})
            assert busy["error"]["code"] == "auth_busy"
            dup = await service.request(
                "status", request_id=request_id
            )  # the start ID stays reserved until the terminal
            assert dup["error"]["code"] == "duplicate_request_id"
            cancel = await service.request("auth.login.cancel", {"login_id": login_id})
            assert cancel["payload"] == {"login_id": login_id, "status": "cancellation_requested"}
            _, terminal = await _terminal(service, request_id)
            assert terminal["state"] == "cancelled"
            reused = await service.request("status", request_id=request_id)
            assert reused["error"] is None

            request_id, _, _ = await _login_start(service)
            await service.close_stdin()
            rest = await service.drain_stdout()
            terminals = [m for m in rest if m.get("event") == "auth.login.terminal"]
            assert [t["payload"]["state"] for t in terminals] == ["cancelled"]
            assert await service.wait() == 0


async def test_codex_turn_refreshes_after_401_and_retries(home: Path, project: Path) -> None:
    with FakeOAuthIssuer(account_id=ACCOUNT) as issuer, FakeProviderServer() as provider:
        record = codex_record(issuer.mint_tokens(), time.time())
        AuthStore(home / "auth.json").commit("openai-codex", record, None)
        (home / "settings.json").write_text(json.dumps({"provider": "openai-codex"}))
        provider.enqueue(HttpError(401), Reply(text=["after refresh"]))
        async with running_service(home, project, _env(issuer, provider)) as service:
            turn = await service.request("turn.start", {"prompt": "hi"})
            events = await service.events_until_terminal(turn["request_id"])
        assert events[-1]["payload"]["status"] == "completed"
        assert events[-1]["payload"]["assistant_text"] == "after refresh"
        first, second = (r.headers["authorization"] for r in provider.requests)
        assert first != second
        assert any(r.path.endswith("/oauth/token") for r in issuer.requests)
        stored = AuthStore(home / "auth.json").read().record("openai-codex")
        assert stored is not None and f"Bearer {stored['access_token']}" == second
