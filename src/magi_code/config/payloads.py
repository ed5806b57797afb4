"""A ``config.set`` payload as the change it asks for.

Every request payload is checked against its operation's declared shape
(``protocol/operations.py``) before its handler runs; :func:`parse_config_set` runs the
same checks for callers that did not come through the coordinator, then converts.
"""

from __future__ import annotations

from magi_code.config.settings import Scope
from magi_code.dataclass import dataclass
from magi_code.protocol.operations import declared


@dataclass(frozen=True, slots=True)
class ConfigChange:
    scope: Scope
    selection: tuple[str, str] | None = None
    thinking_level: str | None = None
    fast: bool | None = None


def parse_config_set(payload: object) -> ConfigChange:
    """Check a ``config.set`` payload as declared, completely, before any settings are
    touched; returns the change it asks for.

    Raises:
        ServiceError: ``invalid_payload`` for shape/type/value problems (including an empty
            mutation or an unknown reasoning value); ``invalid_scope`` for an unknown
            scope or ``fast`` outside the global scope.
    """
    declared("config.set").check(payload, None)
    assert isinstance(payload, dict)
    selection = payload.get("selection")
    return ConfigChange(
        Scope(payload["scope"]),
        None if selection is None else (selection["provider_id"], selection["model_id"]),
        payload.get("thinking_level"),
        payload.get("fast"),
    )
