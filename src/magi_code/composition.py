"""Composition root: builds one coordinator with every domain service.

Both adapters (embedded stdio and the daemon) call this, so v1 and v2 share one core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from magi_code.auth.readiness import is_ready
from magi_code.auth.store import AuthStore
from magi_code.config.effective import resolve_effective
from magi_code.config.schema import write_settings_schema
from magi_code.config.settings import load_settings
from magi_code.core.auth import AuthService
from magi_code.core.configuration import ConfigurationService
from magi_code.core.coordinator import ServiceCoordinator
from magi_code.core.service_info import ServiceInfo
from magi_code.core.sessions import SessionService
from magi_code.core.settings_gate import SettingsGate
from magi_code.core.turns import TurnService
from magi_code.providers.http import HttpClients
from magi_code.sessions.store import SessionStore
from magi_code.storage.launch import LaunchContext
from magi_code.turns.runtime import TurnRuntime

log = logging.getLogger(__name__)


def provider_auth_ready(ctx: LaunchContext) -> bool:
    """Readiness of the current effective selection; no refresh, no network."""
    settings = load_settings(ctx)
    effective = resolve_effective(ctx, settings)
    snapshot = AuthStore(ctx.auth_path).read()
    return is_ready(ctx, effective.provider or effective.provider_id, snapshot)


async def build_coordinator(
    ctx: LaunchContext, transports: Sequence[str] = ("stdio",)
) -> ServiceCoordinator:
    try:
        # Startup may create the runtime home and the generated settings schema.
        await asyncio.to_thread(write_settings_schema, ctx)
    except OSError:
        log.warning("could not write the settings schema")
    coordinator = ServiceCoordinator(transports)
    coordinator.add_service(ServiceInfo(coordinator, provider_auth_ready))
    sessions = SessionService(SessionStore(ctx.sessions_dir))
    coordinator.add_service(sessions)
    # One client cache for turns and catalogs: clients per endpoint, credential and the
    # frontend's proxy/CA settings, never one client shared by every frontend.
    clients = HttpClients()
    runtime = TurnRuntime(clients)
    gate = SettingsGate()
    coordinator.add_service(TurnService(sessions, runtime, gate))
    coordinator.add_service(AuthService())
    coordinator.add_service(ConfigurationService(clients, gate))
    return coordinator
