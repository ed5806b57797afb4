"""Bounded JSON validation: every advertised structural limit, checked without recursion.

The record limit (64 KiB) already bounds what the parser allocates; this walk enforces the
per-value limits (depth, array items, object fields, string and key bytes) on inbound and
outbound values alike.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ErrorCode, ServiceError
from .limits import MAX_ARRAY_ITEMS, MAX_JSON_DEPTH, MAX_OBJECT_FIELDS, MAX_STRING_BYTES

# A str of at most this many code points is at most MAX_STRING_BYTES in UTF-8.
_SAFE_STR_CHARS = MAX_STRING_BYTES // 4


def string_fits(value: str, limit: int = MAX_STRING_BYTES) -> bool:
    if len(value) <= limit // 4:
        return True
    if len(value) > limit:
        return False
    return len(value.encode("utf-8", "surrogatepass")) <= limit


def _check_string(value: str) -> None:
    if len(value) > _SAFE_STR_CHARS and not string_fits(value):
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)


def check_bounds(value: object, depth: int = 1) -> None:
    """Raise ``limit_exceeded`` if ``value`` breaks a structural limit.

    Depth counts containers: a top-level object is depth 1, or ``depth`` for a value
    nested that deep in a record. Strings are checked where they are met; only
    containers go on the stack (wide records are the common case).
    """
    if isinstance(value, str):
        _check_string(value)
        return
    stack: list[tuple[dict[str, object] | list[object], int]] = []
    if isinstance(value, (dict, list)):
        stack.append((value, depth))
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
        if type(item) is dict:
            if len(item) > MAX_OBJECT_FIELDS:
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
            for key in item:
                _check_string(key)
            children: Iterable[object] = item.values()
        else:
            if len(item) > MAX_ARRAY_ITEMS:
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
            children = item
        for child in children:
            if isinstance(child, str):
                _check_string(child)
            elif isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
