"""Composition root: builds one coordinator with every domain service.

Both adapters (embedded stdio and the daemon) call this, so v1 and v2 share one core.
"""

from __future__ import annotations

from collections.abc import Sequence

from magi_code.auth.readiness import is_ready
from magi_code.auth.store import AuthStore
from magi_code.config.effective import resolve_effective
from magi_code.config.settings import load_settings
from magi_code.core.coordinator import ServiceCoordinator
from magi_code.core.service_info import ServiceInfo
from magi_code.core.sessions import SessionService
from magi_code.core.turns import TurnService
from magi_code.sessions.store import SessionStore
from magi_code.storage.launch import LaunchContext
from magi_code.turns.runtime import TurnRuntime


def provider_auth_ready(ctx: LaunchContext) -> bool:
    """Readiness of the current effective selection; no refresh, no network."""
    settings = load_settings(ctx)
    effective = resolve_effective(ctx, settings)
    snapshot = AuthStore(ctx.auth_path).read()
    return is_ready(ctx, effective.provider or effective.provider_id, snapshot)


async def build_coordinator(
    ctx: LaunchContext, transports: Sequence[str] = ("stdio",)
) -> ServiceCoordinator:
    coordinator = ServiceCoordinator(transports)
    coordinator.add_service(ServiceInfo(coordinator, provider_auth_ready))
    sessions = SessionService(SessionStore(ctx.sessions_dir))
    coordinator.add_service(sessions)
    coordinator.add_service(TurnService(sessions, TurnRuntime()))
    return coordinator
