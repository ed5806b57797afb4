"""The consumer profile of the v1 definitions, checked in Python: one record a client reads.

:func:`check_record` accepts exactly what the consumer JSON Schema bundle
(``schema_documents("consumer")["v1"]``, checked with its ``x-max-utf8-bytes``,
``x-printable`` and ``x-max-json-bytes`` annotations) accepts, by reading the same
declarations the bundle is rendered from; the tests hold the two to each other on every
consumer fixture. It is what :class:`magi_code.client.v1stream.V1StreamValidator` applies
to each record before its checks across records (correlation, sequences, terminals).

Two places where this module is right and plain JSON Schema is not: a JSON number with a
fraction (``1.0``) is not an integer here, and a pattern's ``$`` ends the string (as in
ECMA-262; Python's ``$`` also matches before a final newline).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

import orjson

from magi_code.protocol.bounds import check_bounds, string_fits
from magi_code.protocol.errors import ServiceError
from magi_code.protocol.limits import MAX_ARRAY_ITEMS, MAX_OBJECT_FIELDS, MAX_STRING_BYTES

from . import definitions as v1
from .model import (
    PAYLOAD_LEVEL,
    Arr,
    Bool,
    ExactlyOne,
    Forbid,
    Int,
    Nullable,
    Obj,
    RequireAny,
    Shape,
    Str,
    Union,
    effective,
)

_RESPONSES: Final = {op.name: op.response for op in v1.OPERATIONS}
_EVENTS: Final = {ev.name: ev for ev in v1.EVENTS}


class Mismatch(Exception):
    """A record breaks the consumer profile.

    ``path`` is where (``("payload", "activity", "kind")``), ``rule`` which constraint
    (``type``, ``required``, ``const``, ``enum``, ``tag``, ``pattern``, ``min_length``,
    ``max_length``, ``max_bytes``, ``printable``, ``minimum``, ``maximum``,
    ``min_items``, ``max_items``, ``contains``, ``max_properties``, ``bounds``,
    ``max_json_bytes``, ``exactly_one``, ``require_any``, ``forbid``), and ``shape`` the
    declaration it breaks.
    """

    def __init__(self, path: tuple[str | int, ...], rule: str, shape: Shape | None) -> None:
        where = ".".join(str(p) for p in path) or "the record"
        super().__init__(f"{where}: {rule}")
        self.path = path
        self.rule = rule
        self.shape = shape


@cache
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.removesuffix("$") + r"\Z" if pattern.endswith("$") else pattern)


def _string(shape: Str, value: object, path: tuple[str | int, ...]) -> None:
    if not isinstance(value, str):
        raise Mismatch(path, "type", shape)
    if shape.const is not None and value != shape.const:
        raise Mismatch(path, "const", shape)
    enum = shape.enum if shape.fallback is None else None
    if enum is not None and value not in enum:
        raise Mismatch(path, "enum", shape)
    if shape.min_length is not None and len(value) < shape.min_length:
        raise Mismatch(path, "min_length", shape)
    if shape.max_length is not None and len(value) > shape.max_length:
        raise Mismatch(path, "max_length", shape)
    if shape.const is None and enum is None:
        limit = MAX_STRING_BYTES if shape.max_bytes is None else shape.max_bytes
        if not string_fits(value, limit):
            raise Mismatch(path, "max_bytes", shape)
    pattern = r"\S" if shape.non_blank else shape.pattern
    if pattern is not None and not _pattern(pattern).search(value):
        raise Mismatch(path, "pattern", shape)
    if shape.printable and not value.isprintable():
        raise Mismatch(path, "printable", shape)


def _integer(shape: Int, value: object, path: tuple[str | int, ...]) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise Mismatch(path, "type", shape)
    if shape.const is not None and value != shape.const:
        raise Mismatch(path, "const", shape)
    if shape.minimum is not None and value < shape.minimum:
        raise Mismatch(path, "minimum", shape)
    if shape.maximum is not None and value > shape.maximum:
        raise Mismatch(path, "maximum", shape)


def _array(shape: Arr, value: object, path: tuple[str | int, ...], level: int) -> None:
    if not isinstance(value, list):
        raise Mismatch(path, "type", shape)
    for index, item in enumerate(value):
        check(shape.items, item, (*path, index), level + 1)
    if shape.const is not None and value != list(shape.const):
        raise Mismatch(path, "const", shape)
    if shape.contains is not None and shape.contains not in value:
        raise Mismatch(path, "contains", shape)
    if shape.min_items is not None and len(value) < shape.min_items:
        raise Mismatch(path, "min_items", shape)
    limit = MAX_ARRAY_ITEMS if shape.max_items is None else shape.max_items
    if len(value) > limit:
        raise Mismatch(path, "max_items", shape)


def _object(shape: Obj, value: object, path: tuple[str | int, ...], level: int) -> None:
    if not isinstance(value, dict):
        raise Mismatch(path, "type", shape)
    known = {member.name: member for member in shape.fields}
    for member in shape.fields:
        if member.name in value:
            check(member.shape, value[member.name], (*path, member.name), level + 1)
        elif member.required:
            raise Mismatch((*path, member.name), "required", shape)
    if len(value) > MAX_OBJECT_FIELDS:
        raise Mismatch(path, "max_properties", shape)
    for key, item in value.items():
        if not string_fits(key):
            raise Mismatch((*path, key), "max_bytes", shape)
        if key in known:
            continue
        if shape.unknown is not None:
            check(shape.unknown, item, (*path, key), level + 1)
            continue
        try:  # any JSON value within the structural bounds, nested from its own level
            check_bounds(item, depth=level + 1)
        except ServiceError:
            raise Mismatch((*path, key), "bounds", shape) from None
    for rule in shape.rules:
        _rule(rule, shape, value, path)
    if shape.max_json_bytes is not None and len(orjson.dumps(value)) > shape.max_json_bytes:
        raise Mismatch(path, "max_json_bytes", shape)


def _rule(
    rule: RequireAny | Forbid | ExactlyOne,
    shape: Obj,
    value: Mapping[str, Any],
    path: tuple[str | int, ...],
) -> None:
    if isinstance(rule, RequireAny):
        if not any(name in value for name in rule.names):
            raise Mismatch(path, "require_any", shape)
    elif isinstance(rule, ExactlyOne):
        if sum(value.get(name) is not None for name in rule.names) != 1:
            raise Mismatch(path, "exactly_one", shape)
    elif value.get(rule.when) == rule.value and rule.forbidden in value:
        raise Mismatch((*path, rule.forbidden), "forbid", shape)


def _union(shape: Union, value: object, path: tuple[str | int, ...], level: int) -> None:
    if not isinstance(value, dict):
        raise Mismatch(path, "type", shape)
    tag = value.get(shape.tag)
    for name, variant in zip(shape.tags(), shape.variants, strict=True):
        if tag == name:
            check(variant, value, path, level)
            return
    raise Mismatch((*path, shape.tag), "tag", shape)


def check(shape: Shape, value: object, path: tuple[str | int, ...] = (), level: int = 1) -> None:
    """``value`` (at nesting ``level``; the record is 1) against ``shape``'s consumer
    profile.

    Raises:
        Mismatch: the first constraint it breaks.
    """
    shape = effective(shape, "consumer")
    if isinstance(shape, Nullable):
        if value is not None:
            check(shape.inner, value, path, level)
    elif isinstance(shape, Str):
        _string(shape, value, path)
    elif isinstance(shape, Bool):
        if not isinstance(value, bool):
            raise Mismatch(path, "type", shape)
        if shape.const is not None and value is not shape.const:
            raise Mismatch(path, "const", shape)
    elif isinstance(shape, Int):
        _integer(shape, value, path)
    elif isinstance(shape, Arr):
        _array(shape, value, path, level)
    elif isinstance(shape, Union):
        _union(shape, value, path, level)
    elif isinstance(shape, Obj):
        _object(shape, value, path, level)
    else:
        raise TypeError(f"unknown shape {shape!r}")


def check_record(record: object) -> None:
    """One record a client read (a decoded JSON value), as the consumer bundle checks it:
    a response or an event, its envelope, and its payload against its method's (success)
    or event's declaration.

    Raises:
        Mismatch: where and which constraint the record breaks.
    """
    if not isinstance(record, dict):
        raise Mismatch((), "type", None)
    kind = record.get("kind")
    if kind == "response":
        check(v1.RESPONSE_ENVELOPE, record)
        if record["error"] is None:
            if record["request_id"] is None:
                raise Mismatch(("request_id",), "type", v1.RESPONSE_ENVELOPE)
            response = _RESPONSES.get(record["method"])
            if response is not None:
                check(response, record["payload"], ("payload",), PAYLOAD_LEVEL)
    elif kind == "event":
        check(v1.EVENT_ENVELOPE, record)
        event = _EVENTS[record["event"]]
        if record["request_id"] is None:
            raise Mismatch(("request_id",), "type", v1.EVENT_ENVELOPE)
        if (record["session_id"] is None) == (event.stream == "turn"):
            raise Mismatch(("session_id",), "type", v1.EVENT_ENVELOPE)
        check(event.payload, record["payload"], ("payload",), PAYLOAD_LEVEL)
    else:
        raise Mismatch(("kind",), "const", None)
