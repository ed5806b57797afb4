"""Planted secrets never surface in events, labels, exception text or logs."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.fake_oauth import ERROR_DESCRIPTION, FakeOAuthIssuer
from tests.unit.auth.auth_helpers import WAIT_S, Events, browser_get, make_ctx

from magi_code.auth.credentials import CredentialsError, resolve_headers
from magi_code.auth.login import CodexLogin
from magi_code.auth.readiness import provider_status
from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import codex_record
from magi_code.protocol.errors import ServiceError

ACCOUNT = "acct-PLANTED-7f3a9c"
TOKEN_PREFIX = "tok-PLANTED-51bd"
CODE_PREFIX = "code-PLANTED-a2c4"
ANTHROPIC_KEY = "sk-ant-PLANTED-9c1e"
CUSTOM_KEY = "custom-PLANTED-0d7e"
CUSTOM_ENV = "PLANTED_ENV_NAME"
MANUAL_CODE = "code-PLANTED-manual-e5f6"


@dataclass(frozen=True)
class Provider:
    provider_id: str
    api_key_env: str | None


def _render(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


async def _login(
    ctx_env: dict[str, str], home: Path, store: AuthStore, client: httpx.AsyncClient, how: str
) -> tuple[str, Events, list[str]]:
    events = Events()
    login = CodexLogin(make_ctx(home, **ctx_env), store, events.emit, client)
    task = asyncio.create_task(login.run())
    url = (await events.expect("authorization_url"))["url"]
    await events.expect("waiting")
    _, location, _ = await browser_get(url)
    assert location is not None
    rendered: list[str] = []
    if how == "browser":
        rendered.append((await browser_get(location))[2])
    elif how == "wrong_state":
        login.submit_callback(f"http://localhost/auth/callback?code={MANUAL_CODE}&state=bad")
    else:
        login.submit_callback(location)
    for text in (location, MANUAL_CODE * 200):
        try:
            login.submit_callback(text)
        except ServiceError as exc:
            rendered.append(_render(exc) + json.dumps(exc.to_wire()))
    return await asyncio.wait_for(task, WAIT_S), events, rendered


async def test_planted_secrets_never_surface(
    home: Path, store: AuthStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    issuer = FakeOAuthIssuer(account_id=ACCOUNT, token_prefix=TOKEN_PREFIX, code_prefix=CODE_PREFIX)
    outputs: list[str] = []
    with issuer:
        env = {
            "MC_CODEX_AUTH_ISSUER": issuer.url,
            "MC_OAUTH_CALLBACK_PORT": "0",
            "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            CUSTOM_ENV: CUSTOM_KEY,
        }
        store.commit("anthropic", {"type": "api_key", "key": ANTHROPIC_KEY}, None)
        async with httpx.AsyncClient() as client:
            for how, expected in [
                ("browser", "exchange_succeeded"),
                ("wrong_state", "callback_failed"),
                ("manual", "exchange_failed"),
            ]:
                if expected == "exchange_failed":
                    issuer.mode = "error"
                state, events, rendered = await _login(env, home, store, client, how)
                issuer.mode = "success"
                assert state == expected
                outputs += [state, json.dumps(events.seen), *rendered]
                # The authorization URL is the only URL-bearing event.
                assert [s for s, extra in events.seen if "url" in extra] == ["authorization_url"]

            stored = store.read().record("openai-codex")
            assert stored is not None and stored["account_id"] == ACCOUNT
            planted_tokens = [stored["access_token"], stored["refresh_token"], stored["id_token"]]

            ctx = make_ctx(home, **env)
            providers = [Provider("custom", CUSTOM_ENV)]
            outputs.append(json.dumps(provider_status(ctx, providers, store.read())))

            # Expired credentials with a failing issuer: the turn sees a fixed label.
            issuer.access_ttl = -600
            expired = codex_record(issuer.mint_tokens(), time.time())
            store.commit("openai-codex", expired, None)
            planted_tokens += [expired["access_token"], expired["refresh_token"]]  # type: ignore[index]
            issuer.mode = "error"
            with pytest.raises(CredentialsError) as refresh_error:
                await resolve_headers(ctx, "openai-codex", store, client)
            outputs.append(_render(refresh_error.value))

    # A damaged store holding a token reports a fixed error.
    (home / "auth.json").write_text(f'{{"token": "{planted_tokens[1]}"')
    with pytest.raises(ServiceError) as store_error:
        store.read()
    outputs.append(_render(store_error.value) + repr(store))

    logs = {record: logging.Formatter().format(record) for record in caplog.records}
    everything = "\n".join([*outputs, *logs.values()])
    secrets: list[Any] = [
        ACCOUNT,
        TOKEN_PREFIX,
        CODE_PREFIX,
        ANTHROPIC_KEY,
        CUSTOM_KEY,
        CUSTOM_ENV,
        MANUAL_CODE,
        ERROR_DESCRIPTION,
        *planted_tokens,
    ]
    for secret in secrets:
        assert secret and secret not in everything
    # filelock's own DEBUG tracing names the lock file; the service's logging setup keeps
    # third-party DEBUG off. Everything else must not name the store.
    ours = [*outputs, *(line for record, line in logs.items() if record.name != "filelock")]
    assert str(home) not in "\n".join(ours)
    assert any(r.name.startswith("magi_code.auth") for r in caplog.records)
