"""Blocking domain operations behind ``auth.status`` and ``auth.logout``.

The coordinator validates the request payload shapes, runs these in a worker thread and
wraps the returned payloads; ``ServiceError`` carries the wire code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from magi_code.auth.readiness import ProviderLike, provider_status
from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import BUILTIN_PROVIDER_IDS
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext


def auth_status(
    ctx: LaunchContext,
    providers: Iterable[ProviderLike],
    store: AuthStore,
    now: float | None = None,
) -> dict[str, Any]:
    """``{"providers": [...]}``; an unreadable store raises ``internal_error``."""
    return {"providers": provider_status(ctx, providers, store.read(), now)}


def logout(
    store: AuthStore,
    provider_id: str,
    confirmed: bool,
    providers: Iterable[ProviderLike],
) -> dict[str, Any]:
    """Remove one provider's local record (advancing its generation even if absent).

    Unknown providers fail with ``provider_unavailable`` before confirmation is checked;
    then anything but ``confirmed is True`` is ``confirmation_required``. Environment
    variables and remote credentials are untouched. The coordinator also cancels an
    active Codex login when ``provider_id`` is ``openai-codex``.
    """
    known = set(BUILTIN_PROVIDER_IDS) | {p.provider_id for p in providers}
    if provider_id not in known:
        raise ServiceError(ErrorCode.PROVIDER_UNAVAILABLE)
    if confirmed is not True:
        raise ServiceError(ErrorCode.CONFIRMATION_REQUIRED)
    removed = store.remove(provider_id)
    return {
        "provider_id": provider_id,
        "status": "logged_out",
        "removed": removed,
        "environment_unchanged": True,
    }
