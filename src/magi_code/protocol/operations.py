"""The route facts and request shapes of every v1 operation and event, as the coordinator
applies them.

Generated from the declarations in ``protocol/schema/definitions.py`` (the block below;
``tests/unit/protocol/test_schema.py`` rewrites it when it is stale): the coordinator
reads them at start-up without loading the declarations. Every request payload is
checked against its operation's shape here (``protocol/payloads.py``); domain services
supply only each operation's handler.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.payloads import Member, Rule, Value, check_request

SessionUse = Literal["forbidden", "required", "optional"]


@dataclass(frozen=True, slots=True)
class DeclaredOperation:
    name: str
    # The domain service that runs it (``info``: initialize, status, capabilities).
    service: str
    # What the operation does with the outer ``session_id``.
    session: SessionUse = "forbidden"
    # Refused with ``not_initialized`` before ``initialize`` (after payload validation).
    gated: bool = True
    # An optional outer ``session_id`` that is present must be a session ID.
    checks_session: bool = False
    # The outer ``session_id`` is checked before the payload (else after it).
    session_first: bool = False
    # What its payload must be (default: ``{}``).
    payload: Value = Value(type="object")

    def check(self, payload: Any, session_id: str | None) -> None:
        """Check a request's payload and outer ``session_id`` as declared; raises
        ``ServiceError`` with the first failure's code."""
        checked = self.session == "required" or self.checks_session
        check_request(
            self.payload,
            payload,
            session_id,
            SESSION_ID if checked else None,
            session_first=self.session_first,
        )


@dataclass(frozen=True, slots=True)
class DeclaredEvent:
    name: str
    # The domain service that sends it.
    service: str


# -- generated: do not edit ------------------------------------------------------------------
# fmt: off
# What a session ID is, for an operation that checks its outer ``session_id``.
SESSION_ID: Final = Value(
    type="string",
    codes=(("pattern", ErrorCode.INVALID_SESSION_ID),),
    pattern="^[A-Za-z0-9_][A-Za-z0-9_-]*$",
)
OPERATIONS: Final = (
    DeclaredOperation(
        "initialize",
        "info",
        "optional",
        gated=False,
        payload=Value(
            type="object",
            members=(
                Member(
                    name="supported_protocol_versions",
                    value=Value(
                        type="array",
                        codes=(
                            ("min_items", ErrorCode.LIMIT_EXCEEDED),
                            ("max_items", ErrorCode.LIMIT_EXCEEDED),
                        ),
                        min_items=1,
                        max_items=8,
                        items=Value(type="integer", minimum=0, maximum=65535),
                    ),
                ),
                Member(
                    name="requested_capabilities",
                    value=Value(
                        type="array",
                        codes=(("max_items", ErrorCode.LIMIT_EXCEEDED),),
                        max_items=8,
                        items=Value(
                            type="string",
                            codes=(("max_bytes", ErrorCode.LIMIT_EXCEEDED),),
                            max_bytes=64,
                        ),
                    ),
                    required=False,
                ),
            ),
        ),
    ),
    DeclaredOperation("status", "info", "optional"),
    DeclaredOperation("capabilities", "info", "optional"),
    DeclaredOperation(
        "session.list",
        "sessions",
        payload=Value(
            type="object",
            members=(
                Member(
                    name="after",
                    value=Value(
                        type="string",
                        nullable=True,
                        codes=(("pattern", ErrorCode.INVALID_SESSION_ID),),
                        max_bytes=128,
                        pattern="^[A-Za-z0-9_][A-Za-z0-9_-]*$",
                    ),
                    required=False,
                ),
                Member(
                    name="limit",
                    value=Value(
                        type="integer",
                        codes=(("maximum", ErrorCode.LIMIT_EXCEEDED),),
                        minimum=1,
                        maximum=32,
                    ),
                    required=False,
                ),
            ),
            order=("limit",),
        ),
    ),
    DeclaredOperation("session.create", "sessions"),
    DeclaredOperation("session.open", "sessions", "required"),
    DeclaredOperation(
        "session.replay",
        "sessions",
        "required",
        session_first=True,
        payload=Value(
            type="object",
            members=(
                Member(
                    name="after",
                    value=Value(type="string", nullable=True, max_bytes=128),
                    required=False,
                ),
                Member(
                    name="limit",
                    value=Value(
                        type="integer",
                        codes=(("maximum", ErrorCode.LIMIT_EXCEEDED),),
                        minimum=1,
                        maximum=32,
                    ),
                    required=False,
                ),
            ),
            order=("limit",),
        ),
    ),
    DeclaredOperation("session.close", "sessions", "required"),
    DeclaredOperation(
        "turn.start",
        "turns",
        "optional",
        checks_session=True,
        payload=Value(
            type="object",
            members=(
                Member(name="prompt", value=Value(type="string", non_blank=True)),
                Member(name="options", value=Value(type="object"), required=False),
            ),
        ),
    ),
    DeclaredOperation(
        "turn.cancel",
        "turns",
        "optional",
        payload=Value(
            type="object",
            members=(
                Member(
                    name="turn_id",
                    value=Value(
                        type="string",
                        codes=(("max_bytes", ErrorCode.LIMIT_EXCEEDED),),
                        min_length=1,
                        max_bytes=128,
                    ),
                ),
            ),
        ),
    ),
    DeclaredOperation("auth.status", "auth"),
    DeclaredOperation(
        "auth.login.start",
        "auth",
        payload=Value(
            type="object",
            members=(Member(name="provider_id", value=Value(type="string", min_length=1)),),
        ),
    ),
    DeclaredOperation(
        "auth.login.callback",
        "auth",
        payload=Value(
            type="object",
            members=(
                Member(
                    name="login_id",
                    value=Value(
                        type="string",
                        codes=(("max_bytes", ErrorCode.LIMIT_EXCEEDED),),
                        min_length=1,
                        max_bytes=128,
                    ),
                ),
                Member(name="input", value=Value(type="string")),
            ),
        ),
    ),
    DeclaredOperation(
        "auth.login.cancel",
        "auth",
        payload=Value(
            type="object",
            members=(
                Member(
                    name="login_id",
                    value=Value(
                        type="string",
                        codes=(("max_bytes", ErrorCode.LIMIT_EXCEEDED),),
                        min_length=1,
                        max_bytes=128,
                    ),
                ),
            ),
        ),
    ),
    DeclaredOperation(
        "auth.logout",
        "auth",
        payload=Value(
            type="object",
            members=(
                Member(name="provider_id", value=Value(type="string", min_length=1)),
                Member(name="confirmed", value=Value(type="boolean"), required=False),
            ),
        ),
    ),
    DeclaredOperation(
        "catalog.providers",
        "configuration",
        payload=Value(
            type="object",
            members=(
                Member(
                    name="offset",
                    value=Value(
                        type="integer",
                        codes=(("maximum", ErrorCode.LIMIT_EXCEEDED),),
                        minimum=0,
                        maximum=100000,
                    ),
                    required=False,
                ),
                Member(
                    name="limit",
                    value=Value(
                        type="integer",
                        codes=(("maximum", ErrorCode.LIMIT_EXCEEDED),),
                        minimum=1,
                        maximum=32,
                    ),
                    required=False,
                ),
            ),
            by_constraint=True,
        ),
    ),
    DeclaredOperation(
        "catalog.models",
        "configuration",
        payload=Value(
            type="object",
            members=(
                Member(name="provider_id", value=Value(type="string")),
                Member(
                    name="offset",
                    value=Value(
                        type="integer",
                        codes=(("maximum", ErrorCode.LIMIT_EXCEEDED),),
                        minimum=0,
                        maximum=100000,
                    ),
                    required=False,
                ),
                Member(
                    name="limit",
                    value=Value(
                        type="integer",
                        codes=(("maximum", ErrorCode.LIMIT_EXCEEDED),),
                        minimum=1,
                        maximum=32,
                    ),
                    required=False,
                ),
            ),
            by_constraint=True,
        ),
    ),
    DeclaredOperation(
        "catalog.refresh",
        "configuration",
        payload=Value(
            type="object",
            members=(Member(name="provider_id", value=Value(type="string")),),
        ),
    ),
    DeclaredOperation("config.get", "configuration"),
    DeclaredOperation(
        "config.set",
        "configuration",
        payload=Value(
            type="object",
            members=(
                Member(
                    name="scope",
                    value=Value(
                        type="string",
                        codes=(("enum", ErrorCode.INVALID_SCOPE),),
                        enum=("global", "project"),
                    ),
                ),
                Member(
                    name="selection",
                    value=Value(
                        type="object",
                        members=(
                            Member(name="provider_id", value=Value(type="string")),
                            Member(name="model_id", value=Value(type="string")),
                        ),
                    ),
                    required=False,
                ),
                Member(
                    name="thinking_level",
                    value=Value(
                        type="string",
                        enum=("default", "low", "medium", "high", "x_high", "max"),
                    ),
                    required=False,
                ),
                Member(name="fast", value=Value(type="boolean"), required=False),
            ),
            rules=(
                Rule(names=("selection", "thinking_level", "fast")),
                Rule(names=("fast",), when="scope", equals="project", code=ErrorCode.INVALID_SCOPE),
            ),
        ),
    ),
)
EVENTS: Final = (
    DeclaredEvent("turn.started", "turns"),
    DeclaredEvent("turn.assistant_delta", "turns"),
    DeclaredEvent("turn.activity", "turns"),
    DeclaredEvent("turn.terminal", "turns"),
    DeclaredEvent("auth.login.progress", "auth"),
    DeclaredEvent("auth.login.terminal", "auth"),
)
# fmt: on
# -- end of generated ------------------------------------------------------------------------


def declared(name: str) -> DeclaredOperation:
    """The declared operation ``name``."""
    return next(op for op in OPERATIONS if op.name == name)
