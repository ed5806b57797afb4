"""Bounded JSON validation: every advertised structural limit, checked without recursion.

The record limit (64 KiB) already bounds what the parser allocates; this walk enforces the
per-value limits (depth, array items, object fields, string and key bytes) on inbound and
outbound values alike.
"""

from __future__ import annotations

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


def check_bounds(value: object) -> None:
    """Raise ``limit_exceeded`` if ``value`` breaks a structural limit.

    Depth counts containers: a top-level object is depth 1.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if len(item) > _SAFE_STR_CHARS and not string_fits(item):
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
        elif isinstance(item, dict):
            depth += 1
            if depth > MAX_JSON_DEPTH or len(item) > MAX_OBJECT_FIELDS:
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
            for key, child in item.items():
                if len(key) > _SAFE_STR_CHARS and not string_fits(key):
                    raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
                if isinstance(child, (dict, list, str)):
                    stack.append((child, depth))
        elif isinstance(item, list):
            depth += 1
            if depth > MAX_JSON_DEPTH or len(item) > MAX_ARRAY_ITEMS:
                raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
            stack.extend((child, depth) for child in item if isinstance(child, (dict, list, str)))
