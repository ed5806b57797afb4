"""Composition root: builds one coordinator with every domain service.

Both adapters (embedded stdio and the daemon) call this, so v1 and v2 share one core.
"""

from __future__ import annotations

from collections.abc import Sequence

from magi_code.core.coordinator import ServiceCoordinator
from magi_code.core.service_info import ServiceInfo
from magi_code.storage.launch import LaunchContext


def provider_auth_ready(ctx: LaunchContext) -> bool:
    # Replaced by the auth/config readiness logic as those domains land.
    return False


async def build_coordinator(transports: Sequence[str] = ("stdio",)) -> ServiceCoordinator:
    coordinator = ServiceCoordinator(transports)
    coordinator.add_service(ServiceInfo(coordinator, provider_auth_ready))
    return coordinator
