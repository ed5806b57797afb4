"""Route table types shared by the coordinator and the domain services it composes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from magi_code.dataclass import dataclass
from magi_code.protocol.envelope import Request

from .output import TurnEvent

if TYPE_CHECKING:
    from .coordinator import Connection


class SessionRule(Enum):
    """What a method does with the outer ``session_id``."""

    FORBIDDEN = "forbidden"
    REQUIRED = "required"
    OPTIONAL = "optional"


@dataclass(slots=True)
class Reply:
    """A successful synchronous answer.

    ``events`` share the response's batch (``turn.started`` must follow its acceptance
    response directly). ``keep_reserved`` leaves the request ID reserved after the write:
    start requests release it at their terminal event. ``after_write`` runs once the batch
    was written (a turn worker starts streaming only then).
    """

    payload: dict[str, Any]
    session_id: str | None = None
    events: tuple[TurnEvent, ...] = ()
    keep_reserved: bool = False
    after_write: Callable[[], None] | None = None


class RequestExpired(Exception):
    """The request's v2 deadline passed while its handler waited (RFC-0002 §6.6): it took
    no effect, and the transport answers it as one that expired before it ran."""


# A handler returns a Reply, or None when it answers later through
# ``Connection.respond`` (the configuration worker does, so input keeps flowing).
Handler = Callable[["Connection", Request, Any], Awaitable[Reply | None]]
Validator = Callable[[Request], Any]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a domain service supplies for one operation: its handler and, only where the
    operation has one, a check its declared request shape cannot express. Everything
    else about the operation, the checks of its payload included, is declared
    (``protocol/operations``).

    ``check`` runs after the declared checks and before the initialization gate; what it
    returns is what the handler gets, which is otherwise the checked payload."""

    handle: Handler
    check: Validator | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """An operation as the coordinator applies it: its declaration and its endpoint."""

    name: str
    # The declared checks, then the endpoint's own: what the handler gets.
    validate: Validator
    handle: Handler
    session: SessionRule = SessionRule.FORBIDDEN
    gated: bool = True


def required_session(request: Request) -> str:
    """The outer session ID of an operation that requires one (the coordinator refused
    the request without it)."""
    assert request.session_id is not None
    return request.session_id
