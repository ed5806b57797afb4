"""OpenAI (ChatGPT) OAuth wire facts shared by login and refresh.

Values follow Codex CLI (``codex-rs/login``): public client, PKCE S256, issuer
``https://auth.openai.com`` (``MC_CODEX_AUTH_ISSUER`` overrides it for tests and proxies).
Errors never carry the issuer's response: callers only learn that a step failed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode, urlsplit

from magi_code.protocol.errors import ErrorCode, ServiceError

if TYPE_CHECKING:
    import httpx

DEFAULT_ISSUER: Final = "https://auth.openai.com"
CLIENT_ID: Final = "app_EMoamEEZ73f0CkXaXp7hrann"
SCOPE: Final = "openid profile email offline_access api.connectors.read api.connectors.invoke"
DEFAULT_CALLBACK_PORT: Final = 1455
CALLBACK_PATH: Final = "/auth/callback"
# The authorization URL is the one URL-bearing auth event; it must stay well inside the
# advertised string bound. Real URLs are ~600 bytes; a longer one means a bad issuer.
MAX_AUTHORIZE_URL_BYTES: Final = 2048
MAX_ISSUER_CHARS: Final = 512
# Token responses are a few KiB; reading stops (and the step fails) beyond this.
MAX_TOKEN_RESPONSE_BYTES: Final = 256 * 1024
TOKEN_TIMEOUT_S: Final = 30.0


class TokenRequestError(Exception):
    """A token endpoint call failed; deliberately carries no detail."""

    def __init__(self) -> None:
        super().__init__("token_request_failed")


def issuer_url(env: Mapping[str, str]) -> str:
    """The issuer base URL without a trailing slash; a malformed override is refused."""
    issuer = (env.get("MC_CODEX_AUTH_ISSUER") or DEFAULT_ISSUER).rstrip("/")
    parts = urlsplit(issuer)
    if (
        len(issuer) > MAX_ISSUER_CHARS
        or parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.query
        or parts.fragment
    ):
        raise ServiceError(ErrorCode.INTERNAL_ERROR)
    return issuer


def callback_port(env: Mapping[str, str]) -> int:
    """``MC_OAUTH_CALLBACK_PORT`` (0 = any free port), else Codex's registered 1455."""
    raw = env.get("MC_OAUTH_CALLBACK_PORT")
    if raw is None or raw == "":
        return DEFAULT_CALLBACK_PORT
    if not raw.isdigit() or int(raw) > 65535:
        raise ServiceError(ErrorCode.INTERNAL_ERROR)
    return int(raw)


_CODE_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/="
)
MAX_CODE_CHARS: Final = 2048


def valid_code(code: str | None) -> bool:
    """Whether ``code`` looks like an authorization code (no spaces, URL or HTML)."""
    if not code or len(code) > MAX_CODE_CHARS:
        return False
    return set(code) <= _CODE_CHARS


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def new_pkce() -> tuple[str, str]:
    """``(verifier, S256 challenge)``: 64 random bytes, as Codex does."""
    verifier = _b64url(secrets.token_bytes(64))
    return verifier, _b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def new_state() -> str:
    return _b64url(secrets.token_bytes(32))


def redirect_uri(port: int) -> str:
    # Codex registers ``localhost`` (not 127.0.0.1) with the issuer; the listener still
    # binds the IPv4 loopback only.
    return f"http://localhost:{port}{CALLBACK_PATH}"


def authorize_url(issuer: str, redirect: str, challenge: str, state: str) -> str:
    params = [
        ("response_type", "code"),
        ("client_id", CLIENT_ID),
        ("redirect_uri", redirect),
        ("scope", SCOPE),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
        ("id_token_add_organizations", "true"),
        ("codex_cli_simplified_flow", "true"),
        ("state", state),
        ("originator", "codex_cli_rs"),
    ]
    url = f"{issuer}/oauth/authorize?{urlencode(params)}"
    if len(url.encode()) > MAX_AUTHORIZE_URL_BYTES:
        raise ServiceError(ErrorCode.INTERNAL_ERROR)
    return url


async def _post_token(
    client: httpx.AsyncClient, issuer: str, timeout: float, **kwargs: Any
) -> dict[str, Any]:
    import httpx

    try:
        # One overall deadline: httpx timeouts are per phase, so a dripping peer could
        # otherwise hold the login or the turn far longer than ``timeout``.
        async with (
            asyncio.timeout(timeout),
            client.stream(
                "POST",
                f"{issuer}/oauth/token",
                headers={"Accept": "application/json"},
                timeout=timeout,
                **kwargs,
            ) as response,
        ):
            if response.status_code != 200:
                raise TokenRequestError()
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_TOKEN_RESPONSE_BYTES:
                    raise TokenRequestError()
    except (httpx.HTTPError, httpx.InvalidURL, TimeoutError):
        raise TokenRequestError() from None
    try:
        parsed = json.loads(bytes(body))
    except ValueError:
        raise TokenRequestError() from None
    if not isinstance(parsed, dict):
        raise TokenRequestError()
    return parsed


async def exchange_code(
    client: httpx.AsyncClient,
    issuer: str,
    *,
    code: str,
    redirect: str,
    verifier: str,
    timeout: float = TOKEN_TIMEOUT_S,
) -> dict[str, Any]:
    """Authorization-code grant (form-encoded, as Codex sends it)."""
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect,
        "client_id": CLIENT_ID,
        "code_verifier": verifier,
    }
    return await _post_token(client, issuer, timeout, data=form)


async def refresh_tokens(
    client: httpx.AsyncClient,
    issuer: str,
    refresh_token: str,
    timeout: float = TOKEN_TIMEOUT_S,
) -> dict[str, Any]:
    """Refresh grant (JSON body, as current Codex sends it)."""
    body = {"client_id": CLIENT_ID, "grant_type": "refresh_token", "refresh_token": refresh_token}
    return await _post_token(client, issuer, timeout, json=body)
