"""``auth.status`` entries and the ``status.provider_auth_ready`` check.

Pure functions over an ``AuthSnapshot`` and the launch environment: no refresh, no
network, no writes. Mapping (documented in ``docs/authentication.md``):

- ``openai-codex``: ``oauth``/``shared_store``; ``ready`` with a refresh token or an
  unexpired access token, ``needs_login`` for a record that has neither, else ``missing``.
- ``anthropic``: a nonblank ``ANTHROPIC_API_KEY`` gives ``api_key``/``environment``/``ready``;
  otherwise ``api_key``/``shared_store`` with ``ready`` (stored key), ``needs_login``
  (record without a usable key) or ``missing``.
- custom with ``api_key_env``: ``api_key``/``environment``, ``ready`` or ``missing``.
- custom without it: ``none``/``none``/``ready``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from magi_code.auth.store import AuthSnapshot
from magi_code.auth.tokens import (
    ANTHROPIC_PROVIDER_ID,
    BUILTIN_PROVIDER_IDS,
    CODEX_PROVIDER_ID,
    access_usable,
    api_key,
    oauth_fields,
)
from magi_code.storage.launch import LaunchContext


class ProviderLike(Protocol):
    """What auth needs from a configured provider definition (config layer owns the type)."""

    @property
    def provider_id(self) -> str: ...

    @property
    def api_key_env(self) -> str | None: ...


def env_value(env: Mapping[str, str], name: str | None) -> str | None:
    """A nonblank environment value (surrounding whitespace dropped), else ``None``."""
    value = env.get(name, "").strip() if name else ""
    return value or None


def _entry(provider_id: str, method: str, source: str, readiness: str) -> dict[str, Any]:
    return {
        "provider_id": provider_id,
        "auth_method": method,
        "source": source,
        "readiness": readiness,
        "ready": readiness == "ready",
    }


def _codex(snapshot: AuthSnapshot, now: float) -> dict[str, Any]:
    record = snapshot.record(CODEX_PROVIDER_ID)
    if record is None:
        readiness = "missing"
    else:
        _, refresh, _ = oauth_fields(record)
        usable = refresh is not None or access_usable(record, now)
        readiness = "ready" if usable else "needs_login"
    return _entry(CODEX_PROVIDER_ID, "oauth", "shared_store", readiness)


def _anthropic(env: Mapping[str, str], snapshot: AuthSnapshot) -> dict[str, Any]:
    if env_value(env, "ANTHROPIC_API_KEY") is not None:
        return _entry(ANTHROPIC_PROVIDER_ID, "api_key", "environment", "ready")
    record = snapshot.record(ANTHROPIC_PROVIDER_ID)
    if record is None:
        readiness = "missing"
    else:
        readiness = "ready" if api_key(record) is not None else "needs_login"
    return _entry(ANTHROPIC_PROVIDER_ID, "api_key", "shared_store", readiness)


def _custom(env: Mapping[str, str], provider: ProviderLike) -> dict[str, Any]:
    if not provider.api_key_env:
        return _entry(provider.provider_id, "none", "none", "ready")
    readiness = "ready" if env_value(env, provider.api_key_env) is not None else "missing"
    return _entry(provider.provider_id, "api_key", "environment", readiness)


def provider_status(
    ctx: LaunchContext,
    providers: Iterable[ProviderLike],
    snapshot: AuthSnapshot,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """The ``auth.status`` ``providers`` array: built-ins first, then custom ones by ID."""
    at = time.time() if now is None else now
    entries = [_codex(snapshot, at), _anthropic(ctx.env, snapshot)]
    custom = {p.provider_id: p for p in providers if p.provider_id not in BUILTIN_PROVIDER_IDS}
    entries.extend(_custom(ctx.env, custom[pid]) for pid in sorted(custom))
    return entries


def is_ready(
    ctx: LaunchContext,
    provider: ProviderLike | str,
    snapshot: AuthSnapshot,
    now: float | None = None,
) -> bool:
    """``status.provider_auth_ready`` for the selected provider (unknown IDs are not ready)."""
    at = time.time() if now is None else now
    provider_id = provider if isinstance(provider, str) else provider.provider_id
    if provider_id == CODEX_PROVIDER_ID:
        return bool(_codex(snapshot, at)["ready"])
    if provider_id == ANTHROPIC_PROVIDER_ID:
        return bool(_anthropic(ctx.env, snapshot)["ready"])
    if isinstance(provider, str):
        return False
    return bool(_custom(ctx.env, provider)["ready"])
