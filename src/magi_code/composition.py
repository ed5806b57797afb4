"""Composition root: builds one coordinator with every domain service.

Both adapters (embedded stdio and the daemon) call this, so v1 and v2 share one core.
Every service is built before the first request is read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from magi_code.core.coordinator import DomainService, ServiceCoordinator
from magi_code.core.service_info import ServiceInfo
from magi_code.storage.launch import LaunchContext

log = logging.getLogger(__name__)


def provider_auth_ready(ctx: LaunchContext) -> bool:
    """Readiness of the current effective selection; no refresh, no network."""
    from magi_code.auth.readiness import is_ready
    from magi_code.auth.store import AuthStore
    from magi_code.config.effective import resolve_effective
    from magi_code.config.settings import load_settings

    settings = load_settings(ctx)
    effective = resolve_effective(ctx, settings)
    snapshot = AuthStore(ctx.auth_path).read()
    return is_ready(ctx, effective.provider or effective.provider_id, snapshot)


async def _write_settings_schema(ctx: LaunchContext) -> None:
    from magi_code.config.schema import write_settings_schema

    try:
        # Startup may create the runtime home and the generated settings schema.
        await asyncio.to_thread(write_settings_schema, ctx)
    except OSError:
        log.warning("could not write the settings schema")


def _domain_services(ctx: LaunchContext) -> dict[str, DomainService]:
    """Every service but ``ServiceInfo``, in registration order."""
    from magi_code.core.auth import AuthService
    from magi_code.core.configuration import ConfigurationService
    from magi_code.core.sessions import SessionService
    from magi_code.core.settings_gate import SettingsGate
    from magi_code.core.turns import TurnService
    from magi_code.providers.http import HttpClients
    from magi_code.sessions.store import SessionStore
    from magi_code.tools.mcp import McpServers
    from magi_code.turns.runtime import TurnRuntime

    sessions = SessionService(SessionStore(ctx.sessions_dir))
    # One client cache for turns and catalogs: clients per endpoint, credential and the
    # frontend's proxy/CA settings, never one client shared by every frontend.
    clients = HttpClients()
    # Warm MCP servers for every connection's turns. First: a closing connection's turns
    # are drained (services close in reverse order) before its servers are stopped.
    mcp = McpServers()
    runtime = TurnRuntime(clients, mcp)
    gate = SettingsGate()
    return {
        "mcp": mcp,
        "sessions": sessions,
        "turns": TurnService(sessions, runtime, gate),
        "auth": AuthService(),
        "configuration": ConfigurationService(clients, gate),
    }


async def build_coordinator(
    ctx: LaunchContext, transports: Sequence[str] = ("stdio",)
) -> ServiceCoordinator:
    """A coordinator with every domain service built."""
    await _write_settings_schema(ctx)
    coordinator = ServiceCoordinator(transports)
    coordinator.add_service("info", ServiceInfo(coordinator, provider_auth_ready))
    for key, service in _domain_services(ctx).items():
        coordinator.add_service(key, service)
    return coordinator
