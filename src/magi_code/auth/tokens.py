"""OAuth token shapes: JWT claim reading and the Codex credential record.

Codex reads ID/access token claims without checking the signature (the tokens come
straight from the issuer over TLS); we do the same and only use them for the account ID
and expiry, never for authorization decisions.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

CODEX_PROVIDER_ID: Final = "openai-codex"
ANTHROPIC_PROVIDER_ID: Final = "anthropic"
BUILTIN_PROVIDER_IDS: Final = (CODEX_PROVIDER_ID, ANTHROPIC_PROVIDER_ID)

AUTH_CLAIMS: Final = "https://api.openai.com/auth"
# Tokens beyond this are refused rather than decoded: no real JWT is this large.
MAX_TOKEN_CHARS: Final = 16384


def jwt_claims(token: object) -> dict[str, Any]:
    """The payload of a JWT, or ``{}`` when it is not a decodable JWT."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        return {}
    parts = token.split(".")
    if len(parts) < 2:
        return {}
    middle = parts[1]
    try:
        raw = base64.urlsafe_b64decode(middle + "=" * (-len(middle) % 4))
        claims = json.loads(raw)
    except (ValueError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}


def _account_id(claims: Mapping[str, Any]) -> str | None:
    ns = claims.get(AUTH_CLAIMS)
    if isinstance(ns, dict):
        value = ns.get("chatgpt_account_id")
        if isinstance(value, str) and value:
            return value
    return None


def _expiry(claims: Mapping[str, Any]) -> int | None:
    exp = claims.get("exp")
    if isinstance(exp, int | float) and not isinstance(exp, bool):
        return int(exp)
    return None


def _token(value: object) -> str | None:
    if isinstance(value, str) and value and len(value) <= MAX_TOKEN_CHARS:
        return value
    return None


def codex_record(
    response: Mapping[str, Any],
    now: float,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Build the stored Codex record from a token response; ``None`` if unusable.

    ``previous`` is only passed for a refresh of the same account: a refresh response may
    omit the rotated refresh token or ID token, in which case the stored ones stay valid.
    A fresh login passes nothing, so it never inherits another account's refresh token.
    """
    access = _token(response.get("access_token"))
    if access is None:
        return None
    prev = previous or {}
    id_token = _token(response.get("id_token")) or _token(prev.get("id_token"))
    refresh = _token(response.get("refresh_token")) or _token(prev.get("refresh_token"))
    access_claims = jwt_claims(access)
    account = (
        _account_id(jwt_claims(id_token))
        or _account_id(access_claims)
        or _token(prev.get("account_id"))
    )
    expires_at = _expiry(access_claims)
    expires_in = response.get("expires_in")
    if expires_at is None and isinstance(expires_in, int) and not isinstance(expires_in, bool):
        expires_at = int(now) + expires_in
    return {
        "type": "oauth",
        "access_token": access,
        "refresh_token": refresh,
        "id_token": id_token,
        "account_id": account,
        "expires_at": expires_at,
    }


def oauth_fields(record: Mapping[str, Any] | None) -> tuple[str | None, str | None, int | None]:
    """``(access_token, refresh_token, expires_at)`` of a well-formed OAuth record."""
    if record is None or record.get("type") != "oauth":
        return None, None, None
    expires = record.get("expires_at")
    if not isinstance(expires, int) or isinstance(expires, bool):
        expires = None
    return _token(record.get("access_token")), _token(record.get("refresh_token")), expires


def access_usable(record: Mapping[str, Any] | None, now: float, margin: float = 0.0) -> bool:
    """Whether the stored access token can be sent as is (unknown expiry counts as usable)."""
    access, _, expires = oauth_fields(record)
    return access is not None and (expires is None or expires > now + margin)


def api_key(record: Mapping[str, Any] | None) -> str | None:
    if record is None or record.get("type") != "api_key":
        return None
    key = record.get("key")
    return key if isinstance(key, str) and key.strip() else None
