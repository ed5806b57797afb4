"""``initialize``, ``status`` and ``capabilities``: negotiation and service discovery."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Final

from magi_code.protocol.bounds import string_fits
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import (
    ADVERTISED_LIMITS,
    MAX_NAME_BYTES,
    MAX_NEGOTIATION_ITEMS,
    MAX_SUMMARY_BYTES,
    PROTOCOL_VERSION,
)
from magi_code.storage.launch import LaunchContext
from magi_code.version import package_version

from .coordinator import Connection, ServiceCoordinator
from .routes import Reply, Route, SessionRule, check_fields, empty_payload

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

_INIT_FIELDS: Final = frozenset({"supported_protocol_versions", "requested_capabilities"})

# Reads settings, shared auth and the context's environment; never refreshes or uses the
# network. Raises ServiceError when settings or auth cannot be read.
ReadinessCheck = Callable[[LaunchContext], bool]


def _negotiation_list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    if not value or len(value) > MAX_NEGOTIATION_ITEMS:
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    return value


def validate_initialize(request: Request) -> None:
    payload = request.payload
    check_fields(payload, _INIT_FIELDS)
    if "supported_protocol_versions" not in payload:
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    versions = _negotiation_list(payload["supported_protocol_versions"])
    for item in versions:
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= 0xFFFF:
            raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    requested = payload.get("requested_capabilities", [])
    if not isinstance(requested, list):
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    if len(requested) > MAX_NEGOTIATION_ITEMS:
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    for name in requested:
        if not isinstance(name, str):
            raise ServiceError(ErrorCode.INVALID_PAYLOAD)
        if not string_fits(name, MAX_NAME_BYTES):
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
    if PROTOCOL_VERSION not in versions:
        raise ServiceError(ErrorCode.UNSUPPORTED_VERSION)


class ServiceInfo:
    """Negotiation and discovery; advertises exactly the routes the coordinator answers."""

    def __init__(self, coordinator: ServiceCoordinator, readiness: ReadinessCheck) -> None:
        self._coordinator = coordinator
        self._readiness = readiness
        self._version = package_version()

    def routes(self) -> Sequence[Route]:
        return (
            Route("initialize", validate_initialize, self._initialize, SessionRule.OPTIONAL, False),
            Route("status", empty_payload, self._status, SessionRule.OPTIONAL),
            Route("capabilities", empty_payload, self._capabilities, SessionRule.OPTIONAL),
        )

    def events(self) -> Sequence[str]:
        return ()

    async def connection_closed(self, connection: Connection) -> None:
        return None

    def capabilities(self, conn: Connection) -> dict[str, Any]:
        return {
            "protocol_versions": [PROTOCOL_VERSION],
            "operations": self._coordinator.operations,
            "events": self._coordinator.events,
            "transports": list(conn.transports),
            "limits": dict(ADVERTISED_LIMITS),
            "activity": dict(ACTIVITY_CAPABILITIES),
        }

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

    async def _status(self, conn: Connection, request: Request, _: None) -> Reply:
        try:
            ready = await asyncio.to_thread(self._readiness, conn.ctx)
        except ServiceError as exc:
            raise ServiceError(ErrorCode.INTERNAL_ERROR) from exc
        return Reply({"service": "ready", "provider_auth_ready": ready})

    async def _capabilities(self, conn: Connection, request: Request, _: None) -> Reply:
        return Reply(self.capabilities(conn))
