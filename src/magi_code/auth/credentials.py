"""Auth headers for a provider call, refreshing Codex credentials inside the turn path.

Failures raise ``CredentialsError`` with a fixed label the turn reports as is; nothing
from the store, the environment or the issuer reaches the label or the exception chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from magi_code.auth import oauth
from magi_code.auth.readiness import ProviderLike, env_value
from magi_code.auth.store import AuthChanged, AuthSnapshot, AuthStore
from magi_code.auth.tokens import (
    ANTHROPIC_PROVIDER_ID,
    CODEX_PROVIDER_ID,
    access_usable,
    api_key,
    codex_record,
    oauth_fields,
)
from magi_code.protocol.errors import ServiceError
from magi_code.providers.apis import API_PROFILES
from magi_code.providers.errors import ProviderFailure
from magi_code.providers.http import ClientSource, as_source
from magi_code.storage.launch import LaunchContext

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

AUTH_MISSING: Final = "auth_missing"
AUTH_REFRESH_FAILED: Final = "auth_refresh_failed"
AUTH_UNREADABLE: Final = "auth_unreadable"
# Refresh this long before the access token's ``exp`` so it cannot expire mid-request.
REFRESH_MARGIN_S: Final = 60.0


class CredentialsError(Exception):
    """Credentials could not be prepared; ``label`` is one of the fixed labels above."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.label = label


async def _read(store: AuthStore) -> AuthSnapshot:
    try:
        return await asyncio.to_thread(store.read)
    except ServiceError:
        raise CredentialsError(AUTH_UNREADABLE) from None


def _codex_headers(record: Mapping[str, Any]) -> dict[str, str]:
    access, _, _ = oauth_fields(record)
    if access is None:
        raise CredentialsError(AUTH_MISSING)
    headers = {"Authorization": f"Bearer {access}"}
    account = record.get("account_id")
    if isinstance(account, str) and account:
        headers["ChatGPT-Account-ID"] = account
    return headers


async def _codex(
    ctx: LaunchContext,
    store: AuthStore,
    client: ClientSource,
    now: float,
    force_refresh: bool,
) -> dict[str, str]:
    snapshot = await _read(store)
    record = snapshot.record(CODEX_PROVIDER_ID)
    if record is None:
        raise CredentialsError(AUTH_MISSING)
    if not force_refresh and access_usable(record, now, REFRESH_MARGIN_S):
        return _codex_headers(record)
    _, refresh, _ = oauth_fields(record)
    if refresh is None:
        raise CredentialsError(AUTH_MISSING)
    observed = snapshot.generation(CODEX_PROVIDER_ID)
    fresh = await _refreshed(ctx, client, record, refresh, now)
    if fresh is None:
        # Another turn or process may have rotated the token first; its result wins.
        return await _newer_or_fail(store, observed, now)
    try:
        await asyncio.to_thread(store.commit, CODEX_PROVIDER_ID, fresh, observed)
        changed = False
    except AuthChanged:
        changed = True
    except ServiceError:
        # The issuer may have rotated the refresh token we could not persist.
        log.warning("codex credential refresh could not be stored")
        raise CredentialsError(AUTH_REFRESH_FAILED) from None
    if changed:
        return await _newer_or_fail(store, observed, now)
    return _codex_headers(fresh)


async def _refreshed(
    ctx: LaunchContext,
    clients: ClientSource,
    record: Mapping[str, Any],
    refresh: str,
    now: float,
) -> dict[str, Any] | None:
    """The refreshed record, or ``None`` when the issuer refused or failed."""
    # The issuer's client is per account (the refresh token when there is none), so
    # cookies never cross accounts; proxy and CAs are the caller's.
    account = record.get("account_id")
    identity = {"chatgpt-account-id": account} if isinstance(account, str) and account else {}
    try:
        issuer = oauth.issuer_url(ctx.env)
        async with clients.lease(issuer, identity or {"refresh-token": refresh}) as client:
            response = await oauth.refresh_tokens(client, issuer, refresh)
    except (ServiceError, oauth.TokenRequestError, ProviderFailure):
        log.warning("codex credential refresh failed")
        return None
    return codex_record(response, now, previous=record)


async def _newer_or_fail(store: AuthStore, observed: int, now: float) -> dict[str, str]:
    snapshot = await _read(store)
    record = snapshot.record(CODEX_PROVIDER_ID)
    if snapshot.generation(CODEX_PROVIDER_ID) == observed:
        raise CredentialsError(AUTH_REFRESH_FAILED)
    if record is None:
        raise CredentialsError(AUTH_MISSING)
    if not access_usable(record, now):
        raise CredentialsError(AUTH_REFRESH_FAILED)
    return _codex_headers(record)


async def resolve_headers(
    ctx: LaunchContext,
    provider: ProviderLike | str,
    store: AuthStore,
    client: httpx.AsyncClient | ClientSource,
    now: float | None = None,
    *,
    force_refresh: bool = False,
) -> dict[str, str]:
    """Headers authorizing one provider request.

    ``client`` is only used for a Codex token refresh: a client, or where to lease the
    issuer's client (``providers.http``, with the caller's proxy and CAs).

    - ``anthropic``: ``x-api-key`` from a nonblank ``ANTHROPIC_API_KEY``, else the store.
    - ``openai-codex``: ``Authorization: Bearer`` + ``ChatGPT-Account-ID``; refreshes first
      when the access token is expired or within ``REFRESH_MARGIN_S`` of expiry (or when
      ``force_refresh`` is set, e.g. after a 401), committing against the generation read
      before the refresh.
    - custom: ``x-api-key`` where its API's profile says so (``anthropic``), otherwise
      ``Authorization: Bearer``, from ``api_key_env``; no headers for no-auth providers.
    """
    at = time.time() if now is None else now
    provider_id = provider if isinstance(provider, str) else provider.provider_id
    if provider_id == CODEX_PROVIDER_ID:
        return await _codex(ctx, store, as_source(client), at, force_refresh)
    if provider_id == ANTHROPIC_PROVIDER_ID:
        key = env_value(ctx.env, "ANTHROPIC_API_KEY")
        if key is None:
            key = api_key((await _read(store)).record(ANTHROPIC_PROVIDER_ID))
        if key is None:
            raise CredentialsError(AUTH_MISSING)
        return {"x-api-key": key}
    if isinstance(provider, str):
        raise CredentialsError(AUTH_MISSING)
    if not provider.api_key_env:
        return {}
    secret = env_value(ctx.env, provider.api_key_env)
    if secret is None:
        raise CredentialsError(AUTH_MISSING)
    api: Any = getattr(provider, "api", None)
    if api in API_PROFILES and API_PROFILES[api].key_in_x_api_key:
        return {"x-api-key": secret}
    return {"Authorization": f"Bearer {secret}"}
