"""Strict request-payload parsing for the five catalog/config routes.

Unknown fields, explicit ``null``, wrong JSON types (booleans are not integers) and
negative/zero paging values are ``invalid_payload``; paging values beyond the advertised
bounds (``limit`` > 32, ``offset`` > 100000) are ``limit_exceeded``. A provider ID that is a
string but unsafe or unknown is a selection problem (``invalid_selection``), raised where
the provider is resolved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from magi_code.config.catalog import check_page
from magi_code.config.ids import THINKING_LEVELS
from magi_code.config.settings import Scope
from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_CATALOG_PAGE_ITEMS

_PAGE_FIELDS: Final = frozenset({"offset", "limit"})
_SET_FIELDS: Final = frozenset({"scope", "selection", "thinking_level", "fast"})
_SELECTION_FIELDS: Final = frozenset({"provider_id", "model_id"})


def _invalid() -> ServiceError:
    return ServiceError(ErrorCode.INVALID_PAYLOAD)


def _object(payload: object, allowed: frozenset[str]) -> Mapping[str, object]:
    if not isinstance(payload, Mapping) or not set(payload) <= allowed:
        raise _invalid()
    if any(value is None for value in payload.values()):
        raise _invalid()
    return payload


def _int(payload: Mapping[str, object], name: str, default: int) -> int:
    value = payload.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid()
    return value


def _page(payload: Mapping[str, object]) -> tuple[int, int]:
    offset = _int(payload, "offset", 0)
    limit = _int(payload, "limit", MAX_CATALOG_PAGE_ITEMS)
    check_page(offset, limit)
    return offset, limit


def _provider_id(payload: Mapping[str, object]) -> str:
    value = payload.get("provider_id")
    if not isinstance(value, str):
        raise _invalid()
    return value


def parse_empty(payload: object) -> None:
    """``config.get`` takes ``{}``."""
    _object(payload, frozenset())


def parse_provider_page(payload: object) -> tuple[int, int]:
    """``catalog.providers`` → ``(offset, limit)``."""
    return _page(_object(payload, _PAGE_FIELDS))


def parse_model_page(payload: object) -> tuple[str, int, int]:
    """``catalog.models`` → ``(provider_id, offset, limit)``."""
    fields = _object(payload, _PAGE_FIELDS | {"provider_id"})
    provider_id = _provider_id(fields)
    offset, limit = _page(fields)
    return provider_id, offset, limit


def parse_refresh(payload: object) -> str:
    """``catalog.refresh`` → ``provider_id``."""
    return _provider_id(_object(payload, frozenset({"provider_id"})))


@dataclass(frozen=True, slots=True)
class ConfigChange:
    scope: Scope
    selection: tuple[str, str] | None = None
    thinking_level: str | None = None
    fast: bool | None = None


def parse_config_set(payload: object) -> ConfigChange:
    """Validate a ``config.set`` payload completely before any settings are touched.

    Raises:
        ServiceError: ``invalid_payload`` for shape/type/value problems (including an empty
            mutation or an unknown reasoning value); ``invalid_scope`` for an unknown
            scope or ``fast`` outside the global scope.
    """
    fields = _object(payload, _SET_FIELDS)
    scope = fields.get("scope")
    if not isinstance(scope, str):
        raise _invalid()
    selection = None
    if "selection" in fields:
        raw = _object(fields["selection"], _SELECTION_FIELDS)
        provider_id, model_id = raw.get("provider_id"), raw.get("model_id")
        if not isinstance(provider_id, str) or not isinstance(model_id, str):
            raise _invalid()
        selection = (provider_id, model_id)
    thinking_level = fields.get("thinking_level")
    if thinking_level is not None and (
        not isinstance(thinking_level, str) or thinking_level not in THINKING_LEVELS
    ):
        raise _invalid()
    fast = fields.get("fast")
    if fast is not None and not isinstance(fast, bool):
        raise _invalid()
    if selection is None and thinking_level is None and fast is None:
        raise _invalid()
    if scope not in (Scope.GLOBAL.value, Scope.PROJECT.value):
        raise ServiceError(ErrorCode.INVALID_SCOPE)
    if scope == Scope.PROJECT.value and fast is not None:
        raise ServiceError(ErrorCode.INVALID_SCOPE)
    return ConfigChange(Scope(scope), selection, thinking_level, fast)
