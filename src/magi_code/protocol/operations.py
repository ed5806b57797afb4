"""The route facts of every v1 operation and event, as the coordinator applies them.

Generated from the declarations in ``protocol/schema/definitions.py`` (the block below;
``tests/unit/protocol/test_schema.py`` rewrites it when it is stale): the coordinator
reads these few facts at start-up without loading the payload shapes. Domain services
supply only each operation's validator and handler.
"""

from __future__ import annotations

from typing import Final, Literal

from magi_code.dataclass import dataclass

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


@dataclass(frozen=True, slots=True)
class DeclaredEvent:
    name: str
    # The domain service that sends it.
    service: str


# -- generated: do not edit ------------------------------------------------------------------
OPERATIONS: Final = (
    DeclaredOperation("initialize", "info", "optional", gated=False),
    DeclaredOperation("status", "info", "optional"),
    DeclaredOperation("capabilities", "info", "optional"),
    DeclaredOperation("session.list", "sessions"),
    DeclaredOperation("session.create", "sessions"),
    DeclaredOperation("session.open", "sessions", "required"),
    DeclaredOperation("session.replay", "sessions", "required"),
    DeclaredOperation("session.close", "sessions", "required"),
    DeclaredOperation("turn.start", "turns", "optional"),
    DeclaredOperation("turn.cancel", "turns", "optional"),
    DeclaredOperation("auth.status", "auth"),
    DeclaredOperation("auth.login.start", "auth"),
    DeclaredOperation("auth.login.callback", "auth"),
    DeclaredOperation("auth.login.cancel", "auth"),
    DeclaredOperation("auth.logout", "auth"),
    DeclaredOperation("catalog.providers", "configuration"),
    DeclaredOperation("catalog.models", "configuration"),
    DeclaredOperation("catalog.refresh", "configuration"),
    DeclaredOperation("config.get", "configuration"),
    DeclaredOperation("config.set", "configuration"),
)
EVENTS: Final = (
    DeclaredEvent("turn.started", "turns"),
    DeclaredEvent("turn.assistant_delta", "turns"),
    DeclaredEvent("turn.activity", "turns"),
    DeclaredEvent("turn.terminal", "turns"),
    DeclaredEvent("auth.login.progress", "auth"),
    DeclaredEvent("auth.login.terminal", "auth"),
)
# -- end of generated ------------------------------------------------------------------------
