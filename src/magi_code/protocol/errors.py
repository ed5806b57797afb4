"""The v1 error-code registry and the one error type domains raise.

Every code carries a short fixed message. Request data never reaches a message:
domains raise ``ServiceError(ErrorCode.X)`` and only the coordinator turns it into a
wire error object.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class ErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    RECORD_TOO_LARGE = "record_too_large"
    INVALID_REQUEST = "invalid_request"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    LIMIT_EXCEEDED = "limit_exceeded"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNSUPPORTED_CAPABILITY = "unsupported_capability"
    UNSUPPORTED_OPERATION = "unsupported_operation"
    NOT_INITIALIZED = "not_initialized"
    INVALID_PAYLOAD = "invalid_payload"
    DUPLICATE_REQUEST_ID = "duplicate_request_id"
    TOO_MANY_ACTIVE_TURNS = "too_many_active_turns"
    SESSION_BUSY = "session_busy"
    SESSION_UNAVAILABLE = "session_unavailable"
    INVALID_SESSION_ID = "invalid_session_id"
    UNKNOWN_TURN = "unknown_turn"
    AUTH_BUSY = "auth_busy"
    UNKNOWN_LOGIN = "unknown_login"
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    CONFIRMATION_REQUIRED = "confirmation_required"
    CONFIGURATION_UNAVAILABLE = "configuration_unavailable"
    CONFIGURATION_BUSY = "configuration_busy"
    CATALOG_REFRESH_FAILED = "catalog_refresh_failed"
    SETTINGS_WRITE_FAILED = "settings_write_failed"
    INVALID_SCOPE = "invalid_scope"
    INVALID_SELECTION = "invalid_selection"
    UNSUPPORTED_REASONING = "unsupported_reasoning"
    CATALOG_UNAVAILABLE = "catalog_unavailable"
    CATALOG_STALE = "catalog_stale"
    INTERNAL_ERROR = "internal_error"


MESSAGES: Final[dict[ErrorCode, str]] = {
    ErrorCode.INVALID_JSON: "The record is not valid JSON.",
    ErrorCode.RECORD_TOO_LARGE: "The JSONL record exceeds the record limit.",
    ErrorCode.INVALID_REQUEST: "The request envelope is invalid.",
    ErrorCode.PAYLOAD_TOO_LARGE: "The payload exceeds its byte limit.",
    ErrorCode.LIMIT_EXCEEDED: "A protocol limit was exceeded.",
    ErrorCode.UNSUPPORTED_VERSION: "The protocol version is unsupported.",
    ErrorCode.UNSUPPORTED_CAPABILITY: "A requested capability is unsupported.",
    ErrorCode.UNSUPPORTED_OPERATION: "The method is not implemented.",
    ErrorCode.NOT_INITIALIZED: "The service has not been initialized.",
    ErrorCode.INVALID_PAYLOAD: "The payload is invalid for this operation.",
    ErrorCode.DUPLICATE_REQUEST_ID: "The request ID is already in flight.",
    ErrorCode.TOO_MANY_ACTIVE_TURNS: "The service has reached its active-turn limit.",
    ErrorCode.SESSION_BUSY: "The session is busy.",
    ErrorCode.SESSION_UNAVAILABLE: "The session is unavailable.",
    ErrorCode.INVALID_SESSION_ID: "The session ID is invalid.",
    ErrorCode.UNKNOWN_TURN: "The turn is unknown or already finished.",
    ErrorCode.AUTH_BUSY: "A login is already active.",
    ErrorCode.UNKNOWN_LOGIN: "The login is unknown or already finished.",
    ErrorCode.PROVIDER_UNAVAILABLE: "The provider does not support this operation.",
    ErrorCode.CONFIRMATION_REQUIRED: "Logout needs explicit confirmation.",
    ErrorCode.CONFIGURATION_UNAVAILABLE: "Settings could not be read.",
    ErrorCode.CONFIGURATION_BUSY: "A catalog or configuration request is running.",
    ErrorCode.CATALOG_REFRESH_FAILED: "Catalog refresh failed; check provider readiness and retry.",
    ErrorCode.SETTINGS_WRITE_FAILED: "The settings update could not be persisted.",
    ErrorCode.INVALID_SCOPE: "The scope is invalid for this setting.",
    ErrorCode.INVALID_SELECTION: "The provider or model is unknown, unsafe, or disabled.",
    ErrorCode.UNSUPPORTED_REASONING: "The reasoning choice is unsupported for the target model.",
    ErrorCode.CATALOG_UNAVAILABLE: "A usable catalog is required; refresh first.",
    ErrorCode.CATALOG_STALE: "A fresh catalog is required; refresh first.",
    ErrorCode.INTERNAL_ERROR: "The service could not handle the request.",
}


class ServiceError(Exception):
    """A failure with a stable wire code; its message is always the fixed one."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.value)
        self.code = code

    @property
    def message(self) -> str:
        return MESSAGES[self.code]

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}
