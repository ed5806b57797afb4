"""``initialize``, ``status`` and ``capabilities``: negotiation and service discovery.

Cheap requests stay cheap: the capabilities payload is built once per transport set (and
again only if the route table changes), and ``status`` answers, in a worker
thread, from a :class:`ReadinessMemo` (a few ``stat`` calls) unless a settings file, the
auth store, the environment or an access token's expiry says it must read again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from magi_code.auth.readiness import ReadinessCheck, ReadinessMemo
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import (
    ADVERTISED_LIMITS,
    MAX_SUMMARY_BYTES,
    PROTOCOL_VERSION,
)
from magi_code.version import package_version

from .coordinator import Connection, ServiceCoordinator
from .routes import Endpoint, Reply

SERVER_NAME: Final = "magi-code"

ACTIVITY_CAPABILITIES: Final[dict[str, Any]] = {
    "events": True,
    "approvals": False,
    "steering": False,
    "mcp_server_lifecycle": False,
    "mcp_tool_activity": True,
    "subagents": True,
    "raw_tool_output": False,
    "activity_replay": False,
    "max_summary_bytes": MAX_SUMMARY_BYTES,
}

# Shared, never mutated: the two possible ``status`` payloads.
_STATUS: Final[dict[bool, dict[str, Any]]] = {
    ready: {"service": "ready", "provider_auth_ready": ready} for ready in (False, True)
}


def _offers_v1(request: Request) -> None:
    """The one check of ``initialize`` its shape cannot express: the client speaks v1."""
    if PROTOCOL_VERSION not in request.payload["supported_protocol_versions"]:
        raise ServiceError(ErrorCode.UNSUPPORTED_VERSION)


class ServiceInfo:
    """Negotiation and discovery; advertises exactly the routes the coordinator answers."""

    def __init__(self, coordinator: ServiceCoordinator, readiness: ReadinessCheck) -> None:
        self._coordinator = coordinator
        self._readiness = ReadinessMemo(readiness)
        self._version = package_version()
        # (transports, route table version) -> the capabilities payload (never mutated).
        self._advertised: dict[tuple[tuple[str, ...], int], dict[str, Any]] = {}

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            "initialize": Endpoint(self._initialize, check=_offers_v1),
            "status": Endpoint(self._status),
            "capabilities": Endpoint(self._capabilities),
        }

    async def connection_closed(self, connection: Connection) -> None:
        return None

    def capabilities(self, conn: Connection) -> dict[str, Any]:
        """The capabilities payload for ``conn`` (shared between answers: never mutate)."""
        key = (conn.transports, self._coordinator.routes_version)
        payload = self._advertised.get(key)
        if payload is None:
            payload = {
                "protocol_versions": [PROTOCOL_VERSION],
                "operations": self._coordinator.operations,
                "events": self._coordinator.events,
                "transports": list(conn.transports),
                "limits": dict(ADVERTISED_LIMITS),
                "activity": dict(ACTIVITY_CAPABILITIES),
            }
            self._advertised[key] = payload
        return payload

    async def _initialize(self, conn: Connection, request: Request, _: None) -> Reply:
        operations = set(self._coordinator.operations)
        for name in request.payload.get("requested_capabilities", []):
            if name not in operations:
                raise ServiceError(ErrorCode.UNSUPPORTED_CAPABILITY)
        conn.initialized = True
        return Reply(
            {
                "protocol_version": PROTOCOL_VERSION,
                "server_name": SERVER_NAME,
                "server_version": conn.server_version or self._version,
                "limits": dict(ADVERTISED_LIMITS),
                "capabilities": self.capabilities(conn),
            }
        )

    async def _status(self, conn: Connection, request: Request, _: object) -> Reply:
        try:
            ready = await asyncio.to_thread(self._readiness.answer, conn.ctx)
        except ServiceError as exc:
            raise ServiceError(ErrorCode.INTERNAL_ERROR) from exc
        return Reply(_STATUS[ready])

    async def _capabilities(self, conn: Connection, request: Request, _: object) -> Reply:
        return Reply(self.capabilities(conn))
