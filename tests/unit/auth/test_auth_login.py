from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from tests.support.fake_oauth import CLIENT_ID, FakeOAuthIssuer
from tests.unit.auth.auth_helpers import WAIT_S, Events, browser_get, make_ctx

from magi_code.auth.login import MAX_CALLBACK_INPUT_BYTES, CodexLogin
from magi_code.auth.store import AuthStore
from magi_code.protocol.errors import ErrorCode, ServiceError

FULL_FLOW = ["authorization_url", "waiting", "callback_received", "callback_accepted"]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


class Flow:
    """One login attempt running in a task, with helpers to play the browser."""

    def __init__(self, login: CodexLogin, events: Events) -> None:
        self.login = login
        self.events = events
        self.task = asyncio.create_task(login.run())
        self.url = ""

    async def started(self) -> dict[str, Any]:
        extra = await self.events.expect("authorization_url")
        await self.events.expect("waiting")
        self.url = extra["url"]
        return extra

    async def redirect(self) -> str:
        """Sign in at the fake issuer; returns the redirect it sends the browser to."""
        status, location, _ = await browser_get(self.url)
        assert status == 302 and location is not None
        return location

    async def result(self) -> str:
        return await asyncio.wait_for(self.task, WAIT_S)


def start(
    home: Path,
    store: AuthStore,
    issuer: FakeOAuthIssuer,
    client: httpx.AsyncClient,
    port: str = "0",
    **kwargs: Any,
) -> Flow:
    ctx = make_ctx(home, MC_CODEX_AUTH_ISSUER=issuer.url, MC_OAUTH_CALLBACK_PORT=port)
    events = Events()
    return Flow(CodexLogin(ctx, store, events.emit, client, **kwargs), events)


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


async def test_browser_flow_through_the_loopback_listener(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    extra = await flow.started()
    assert extra == {"url": flow.url, "open_browser": True}
    assert flow.url.startswith(f"{issuer.url}/oauth/authorize?")
    params = _query(flow.url)
    port = flow.login.bound_port
    assert port is not None and port > 0
    assert params["redirect_uri"] == f"http://localhost:{port}/auth/callback"
    assert params["client_id"] == CLIENT_ID
    assert params["code_challenge_method"] == "S256"
    assert params["response_type"] == "code" and len(params["state"]) >= 32

    location = await flow.redirect()
    status, _, body = await browser_get(location)
    assert status == 200
    assert _query(location)["code"] not in body and _query(location)["state"] not in body
    assert await flow.result() == "exchange_succeeded"
    assert flow.events.states == FULL_FLOW

    snapshot = store.read()
    record = snapshot.record("openai-codex")
    assert record is not None and record["type"] == "oauth"
    assert record["account_id"] == issuer.account_id
    assert record["refresh_token"] in issuer.live_refresh_tokens
    assert isinstance(record["expires_at"], int)
    assert snapshot.generation("openai-codex") == 1
    token_calls = [r for r in issuer.requests if r.path == "/oauth/token"]
    assert [r.params["grant_type"] for r in token_calls] == ["authorization_code"]
    assert token_calls[0].content_type.startswith("application/x-www-form-urlencoded")
    # The listener is gone once the flow ended.
    with pytest.raises(OSError):
        await browser_get(f"http://127.0.0.1:{port}/auth/callback")


async def test_manual_redirect_url_completes_the_flow(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    flow.login.submit_callback(await flow.redirect())
    assert await flow.result() == "exchange_succeeded"
    assert flow.events.states == FULL_FLOW
    assert store.read().record("openai-codex") is not None


@pytest.mark.parametrize("shape", ["bare", "query", "hash"])
async def test_manual_code_forms_complete_the_flow(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient, shape: str
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    params = _query(await flow.redirect())
    text = {
        "bare": f"  {params['code']}\n",
        "query": f"code={params['code']}&state={params['state']}",
        "hash": f"{params['code']}#{params['state']}",
    }[shape]
    flow.login.submit_callback(text)
    assert await flow.result() == "exchange_succeeded"
    assert flow.events.states == FULL_FLOW


@pytest.mark.parametrize(
    "mangle",
    [
        lambda url: url.replace("state=", "state=x"),
        lambda url: url.split("&state=")[0],
        lambda url: url + "&state=again",
        lambda url: url.replace("code=", "error=access_denied&code="),
        lambda url: url.replace("code=", "code=bad%20code"),
        lambda url: "code=abc&state=wrong",
        lambda url: "abc#wrong-state",
        lambda url: "not a code",
    ],
)
async def test_rejected_manual_callback_fails_the_flow(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient, mangle: Any
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    flow.login.submit_callback(mangle(await flow.redirect()))
    assert await flow.result() == "callback_failed"
    assert flow.events.states == ["authorization_url", "waiting", "callback_received"]
    assert not [r for r in issuer.requests if r.path == "/oauth/token"]
    assert store.read().record("openai-codex") is None


async def test_loopback_callback_with_wrong_state_fails_the_flow(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    location = (await flow.redirect()).replace("state=", "state=forged")
    status, _, _ = await browser_get(location)
    assert status == 400
    assert await flow.result() == "callback_failed"
    assert flow.events.states == ["authorization_url", "waiting", "callback_received"]


async def test_loopback_wrong_path_is_404_and_the_flow_continues(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    location = await flow.redirect()
    status, _, _ = await browser_get(location.replace("/auth/callback", "/elsewhere"))
    assert status == 404
    assert flow.events.states == ["authorization_url", "waiting"]
    status, _, _ = await browser_get(location)
    assert status == 200
    assert await flow.result() == "exchange_succeeded"


async def test_busy_port_leaves_manual_submission_available(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        flow = start(home, store, issuer, client, port=str(port))
        await flow.started()
        assert flow.login.bound_port is None
        assert _query(flow.url)["redirect_uri"] == f"http://localhost:{port}/auth/callback"
        flow.login.submit_callback(await flow.redirect())
        assert await flow.result() == "exchange_succeeded"


async def test_callback_input_bounds_and_single_submission(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    for bad in [
        "",
        "a" * (MAX_CALLBACK_INPUT_BYTES + 1),
        "é" * (MAX_CALLBACK_INPUT_BYTES // 2 + 1),
    ]:
        with pytest.raises(ServiceError) as info:
            flow.login.submit_callback(bad)
        assert info.value.code is ErrorCode.INVALID_PAYLOAD
    assert flow.events.states == ["authorization_url", "waiting"]  # nothing consumed yet
    location = await flow.redirect()
    flow.login.submit_callback(location)
    with pytest.raises(ServiceError) as info:
        flow.login.submit_callback(location)
    assert info.value.code is ErrorCode.AUTH_BUSY
    assert await flow.result() == "exchange_succeeded"
    with pytest.raises(ServiceError) as info:
        flow.login.submit_callback(location)
    assert info.value.code is ErrorCode.UNKNOWN_LOGIN


async def test_a_4096_byte_callback_is_accepted_for_validation(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    flow.login.submit_callback("a" * MAX_CALLBACK_INPUT_BYTES)
    assert await flow.result() == "callback_failed"  # too long to be a code, but accepted once


async def test_loopback_callback_after_a_manual_one_is_refused(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    issuer.mode = "slow"
    issuer.slow_seconds = 0.5
    flow = start(home, store, issuer, client)
    await flow.started()
    location = await flow.redirect()
    port = flow.login.bound_port
    flow.login.submit_callback(location)
    with pytest.raises(ServiceError) as info:
        flow.login.submit_callback("another")
    assert info.value.code is ErrorCode.AUTH_BUSY
    await flow.events.expect("callback_received")
    await flow.events.expect("callback_accepted")
    # The listener closed as soon as the callback arrived.
    with pytest.raises(OSError):
        await browser_get(f"http://127.0.0.1:{port}/auth/callback")
    assert await flow.result() == "exchange_succeeded"


async def test_no_callback_times_out(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client, callback_timeout=0.2)
    await flow.started()
    port = flow.login.bound_port
    assert await flow.result() == "callback_timeout"
    assert flow.events.states == ["authorization_url", "waiting"]
    with pytest.raises(OSError):
        await browser_get(f"http://127.0.0.1:{port}/auth/callback")


async def test_cancel_while_waiting(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    flow.login.request_cancel()
    assert await flow.result() == "cancelled"
    assert flow.events.states == ["authorization_url", "waiting"]
    assert store.read().generation("openai-codex") == 0


async def test_cancel_during_exchange_does_not_store(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    issuer.mode = "slow"
    issuer.slow_seconds = 0.3
    flow = start(home, store, issuer, client)
    await flow.started()
    flow.login.submit_callback(await flow.redirect())
    await flow.events.expect("callback_received")
    await flow.events.expect("callback_accepted")
    flow.login.request_cancel()
    assert await flow.result() == "cancelled"
    assert store.read().record("openai-codex") is None


async def test_logout_during_login_yields_auth_changed(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    assert store.remove("openai-codex") is False  # absent record, generation still moves
    flow.login.submit_callback(await flow.redirect())
    assert await flow.result() == "auth_changed"
    assert flow.events.states == FULL_FLOW
    assert store.read().record("openai-codex") is None
    assert store.read().generation("openai-codex") == 1


@pytest.mark.parametrize("mode", ["error", "slow"])
async def test_exchange_failure_or_slow_issuer(
    home: Path,
    store: AuthStore,
    issuer: FakeOAuthIssuer,
    client: httpx.AsyncClient,
    mode: str,
) -> None:
    issuer.slow_seconds = 3.0
    flow = start(home, store, issuer, client, exchange_timeout=0.3)
    await flow.started()
    location = await flow.redirect()
    issuer.mode = mode
    flow.login.submit_callback(location)
    assert await flow.result() == "exchange_failed"
    assert flow.events.states == FULL_FLOW
    assert store.read().generation("openai-codex") == 0


async def test_storage_failure_is_reported(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    flow = start(home, store, issuer, client)
    await flow.started()
    (home / "auth.json").write_bytes(b"damaged")
    (home / "auth.json").chmod(0o600)
    flow.login.submit_callback(await flow.redirect())
    assert await flow.result() == "storage_failed"
    assert (home / "auth.json").read_bytes() == b"damaged"


async def test_unreadable_store_at_start_is_internal_error(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    (home / "auth.json").write_bytes(b"{}")
    (home / "auth.json").chmod(0o644)
    flow = start(home, store, issuer, client)
    assert await flow.result() == "internal_error"
    assert flow.events.states == []


async def test_fresh_login_never_inherits_a_previous_refresh_token(
    home: Path, store: AuthStore, issuer: FakeOAuthIssuer, client: httpx.AsyncClient
) -> None:
    old = {
        "type": "oauth",
        "access_token": "old-access",
        "refresh_token": "rt-PREVIOUS-ACCOUNT",
        "id_token": None,
        "account_id": "acct-previous",
        "expires_at": 1,
    }
    store.commit("openai-codex", old, None)
    issuer.issue_refresh_token = False
    issuer.account_id = "acct-new"
    flow = start(home, store, issuer, client)
    await flow.started()
    flow.login.submit_callback(await flow.redirect())
    assert await flow.result() == "exchange_succeeded"
    record = store.read().record("openai-codex")
    assert record is not None
    assert record["account_id"] == "acct-new"
    assert record["refresh_token"] is None
    assert "rt-PREVIOUS-ACCOUNT" not in (home / "auth.json").read_text()
    assert store.read().generation("openai-codex") == 2
