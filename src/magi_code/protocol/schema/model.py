"""A small declarative model of JSON payload shapes, and its JSON Schema (2020-12) form.

The v1 definitions (``definitions.py``) are written in these terms once; the schema
documents, the reference tables in ``docs/protocol/`` and the request payload checks
(``protocol/payloads.py``, through the generated block of ``protocol/operations.py``)
all read them.

Shapes describe JSON values: :class:`Str`, :class:`Int`, :class:`Bool`, :class:`Arr`,
:class:`Obj` (with :class:`Field` members), :class:`Nullable` and :class:`Union` (a
tagged choice of objects). Every constraint of a *request* shape names the error code a
violation gets (``codes``, default ``invalid_payload``); constraints listed in ``late``
are checked by the operation's handler, after the payload validation derived from the
shape (``protocol/payloads.py``), which lets them pass. An object of a request also
declares the order its members are checked in (``Obj.check_order``, ``by_constraint``).

Every shape renders in two profiles (:data:`Profile`):

- ``strict``: exactly what this service sends and accepts. Objects are closed, every
  enumeration lists today's values. Requests are always rendered this way (the service
  refuses anything else), and the tests validate the service's output against it.
- ``consumer``: what a client reading a v1 service must accept. Objects are open to
  unknown members within the structural bounds (:func:`unknown_member`), while every
  known member is validated as in ``strict``; enumerations stay closed unless the field
  defines a fallback for other values (``Str.fallback``); a shape may name what
  consumers accept instead where a later v1 service may differ (``Shape.consumer``:
  advertised limit values, opaque IDs).

Byte bounds are UTF-8 bounds. JSON Schema can only count code points, so a byte bound
is rendered as ``maxLength`` (a code point is at least one byte, so this is implied)
plus the annotation ``x-max-utf8-bytes``; ``x-printable`` marks identifiers that must be
printable (Python's ``str.isprintable``), and ``x-max-json-bytes`` bounds an object's
compact JSON encoding in UTF-8 bytes (a payload). Validators that do not know these annotations
ignore them; the project's tests and :mod:`.consumer` check them as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from magi_code.dataclass import dataclass, field
from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.limits import (
    MAX_ARRAY_ITEMS,
    MAX_JSON_DEPTH,
    MAX_OBJECT_FIELDS,
    MAX_STRING_BYTES,
)

INVALID: Final = ErrorCode.INVALID_PAYLOAD
MAX_UTF8_BYTES: Final = "x-max-utf8-bytes"
PRINTABLE: Final = "x-printable"
MAX_JSON_BYTES: Final = "x-max-json-bytes"
Profile = Literal["strict", "consumer"]
# Nesting levels: a record is level 1, its payload and error object level 2.
RECORD_LEVEL: Final = 1
PAYLOAD_LEVEL: Final = 2


@dataclass(frozen=True, kw_only=True)
class Shape:
    doc: str = ""
    # constraint name -> the error code a violation gets (requests only).
    codes: Mapping[str, ErrorCode] = field(default_factory=dict)
    # constraints the operation's handler checks (after the derived payload validation).
    late: frozenset[str] = frozenset()
    # attribute -> where the code defines its value (``module:NAME``, or
    # ``module:function.parameter`` for a parameter's ``Literal`` type); a test resolves
    # each one and compares.
    sources: Mapping[str, str] = field(default_factory=dict)
    # What a consumer accepts here instead: where a later v1 service may send other
    # values than this one does (advertised limits, the format of opaque IDs).
    consumer: Shape | None = None

    def code(self, constraint: str) -> ErrorCode:
        return self.codes.get(constraint, INVALID)


@dataclass(frozen=True, kw_only=True)
class Str(Shape):
    min_length: int | None = None  # code points
    max_bytes: int | None = None  # UTF-8 bytes; None: the structural string bound
    pattern: str | None = None
    enum: tuple[str, ...] | None = None
    const: str | None = None
    non_blank: bool = False  # at least one non-whitespace character
    printable: bool = False
    max_length: int | None = None  # code points
    # The field's defined fallback: what another value than ``enum``'s means. Only then
    # does a consumer accept other values (any string within ``max_bytes``).
    fallback: str | None = None
    format: str | None = None
    # For patterns: a valid value and values the pattern rejects (tests, docs).
    example: str | None = None
    counterexamples: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Int(Shape):
    minimum: int | None = None
    maximum: int | None = None
    const: int | None = None


@dataclass(frozen=True, kw_only=True)
class Bool(Shape):
    const: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Arr(Shape):
    items: Shape
    min_items: int | None = None
    max_items: int | None = None  # None: the structural array bound
    # The exact items this version sends, in order (``prefixItems``-like constant lists).
    const: tuple[Any, ...] | None = None
    # A value the array must contain.
    contains: str | None = None


@dataclass(frozen=True, kw_only=True)
class Field:
    name: str
    shape: Shape
    required: bool = True
    doc: str = ""
    # What an absent optional field means.
    default: str | None = None


@dataclass(frozen=True, kw_only=True)
class RequireAny:
    """At least one of ``names`` must be present."""

    names: tuple[str, ...]
    code: ErrorCode = INVALID


@dataclass(frozen=True, kw_only=True)
class Forbid:
    """``forbidden`` must be absent when ``when`` equals ``value``."""

    when: str
    value: str
    forbidden: str
    code: ErrorCode = INVALID


@dataclass(frozen=True, kw_only=True)
class ExactlyOne:
    """Exactly one of ``names`` is not ``null`` (all are required members)."""

    names: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Obj(Shape):
    fields: tuple[Field, ...] = ()
    # Strict profile: no other members (a placeholder ``payload`` is not closed).
    closed: bool = True
    rules: tuple[RequireAny | Forbid | ExactlyOne, ...] = ()
    # Consumer profile: what an unknown member must be (``None``: any JSON value within
    # the structural bounds, see ``unknown_member``).
    unknown: Shape | None = None
    # The most UTF-8 bytes of its compact JSON encoding.
    max_json_bytes: int | None = None
    # Requests: the order its members are checked in (``protocol/payloads.py``): these
    # first, in this order, then the others as declared; ``by_constraint``: every
    # member's type, then every member's next constraint kind (else each member in turn).
    check_order: tuple[str, ...] = ()
    by_constraint: bool = False

    def member(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


@dataclass(frozen=True, kw_only=True)
class Nullable(Shape):
    inner: Shape


@dataclass(frozen=True, kw_only=True)
class Union(Shape):
    """One of ``variants``, told apart by the constant string member ``tag``."""

    tag: str
    variants: tuple[Obj, ...]

    def tags(self) -> list[str]:
        tags = []
        for variant in self.variants:
            shape = variant.member(self.tag).shape
            assert isinstance(shape, Str) and shape.const is not None
            tags.append(shape.const)
        return tags


# -- JSON Schema -------------------------------------------------------------------------

UNKNOWN_DEF: Final = "unknown"


def unknown_ref(levels: int) -> dict[str, Any]:
    """A reference to ``$defs/unknown.<levels>``: a JSON value of at most ``levels``
    nested arrays/objects, every string, key, array and object within the structural
    bounds. ``unknown_definitions`` renders the definitions."""
    return {"$ref": f"#/$defs/{UNKNOWN_DEF}.{levels}"}


def unknown_member(level: int) -> int:
    """How many nesting levels an unknown member of an object at ``level`` may have (the
    record is level 1; nothing is deeper than ``MAX_JSON_DEPTH``)."""
    return MAX_JSON_DEPTH - level


def unknown_definitions(levels: int) -> dict[str, dict[str, Any]]:
    """``unknown.0`` (scalars) to ``unknown.<levels>``."""
    text = {"maxLength": MAX_STRING_BYTES, MAX_UTF8_BYTES: MAX_STRING_BYTES}
    defs: dict[str, dict[str, Any]] = {
        f"{UNKNOWN_DEF}.0": {"type": ["null", "boolean", "number", "string"], **text}
    }
    for n in range(1, levels + 1):
        inner = unknown_ref(n - 1)
        defs[f"{UNKNOWN_DEF}.{n}"] = {
            "type": ["null", "boolean", "number", "string", "array", "object"],
            **text,
            "maxItems": MAX_ARRAY_ITEMS,
            "items": inner,
            "maxProperties": MAX_OBJECT_FIELDS,
            "propertyNames": dict(text),
            "additionalProperties": inner,
        }
    return defs


def effective(shape: Shape, profile: Profile) -> Shape:
    """``shape`` as ``profile`` reads it (its ``consumer`` replacement for consumers)."""
    if profile == "consumer" and shape.consumer is not None:
        return shape.consumer
    return shape


def _string(shape: Str, profile: Profile) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    enum = shape.enum if profile == "strict" or shape.fallback is None else None
    if shape.const is not None:
        schema["const"] = shape.const
    if enum is not None:
        schema["enum"] = list(enum)
    if shape.min_length is not None:
        schema["minLength"] = shape.min_length
    if shape.max_length is not None:
        schema["maxLength"] = shape.max_length
    limit = MAX_STRING_BYTES if shape.max_bytes is None else shape.max_bytes
    if shape.const is None and enum is None:
        schema["maxLength"] = min(limit, schema.get("maxLength", limit))
        schema[MAX_UTF8_BYTES] = limit
    if shape.pattern is not None:
        schema["pattern"] = shape.pattern
    if shape.non_blank:
        schema["pattern"] = r"\S"
    if shape.printable:
        schema[PRINTABLE] = True
    if shape.format is not None:
        schema["format"] = shape.format
    return schema


def _object(shape: Obj, profile: Profile, level: int) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            f.name: _described(to_schema(f.shape, profile, level + 1), f.doc) for f in shape.fields
        },
        "required": [f.name for f in shape.fields if f.required],
    }
    if profile == "consumer":
        schema["maxProperties"] = MAX_OBJECT_FIELDS
        schema["propertyNames"] = {"maxLength": MAX_STRING_BYTES, MAX_UTF8_BYTES: MAX_STRING_BYTES}
        schema["additionalProperties"] = (
            unknown_ref(unknown_member(level))
            if shape.unknown is None
            else to_schema(shape.unknown, profile, level + 1)
        )
    elif shape.closed:
        schema["additionalProperties"] = False
    else:
        schema["maxProperties"] = MAX_OBJECT_FIELDS
    conditions: list[dict[str, Any]] = []
    for rule in shape.rules:
        if isinstance(rule, RequireAny):
            schema["anyOf"] = [{"required": [name]} for name in rule.names]
        elif isinstance(rule, ExactlyOne):
            schema["oneOf"] = [
                {
                    "properties": {
                        other: {"not": {"type": "null"}} if other == name else {"type": "null"}
                        for other in rule.names
                    }
                }
                for name in rule.names
            ]
        else:
            conditions.append(
                {
                    "if": {
                        "properties": {rule.when: {"const": rule.value}},
                        "required": [rule.when],
                    },
                    "then": {"not": {"required": [rule.forbidden]}},
                }
            )
    if conditions:
        schema["allOf"] = conditions
    if shape.max_json_bytes is not None:
        schema[MAX_JSON_BYTES] = shape.max_json_bytes
    return schema


def _described(schema: dict[str, Any], doc: str) -> dict[str, Any]:
    return {"description": doc, **schema} if doc else schema


def to_schema(shape: Shape, profile: Profile = "strict", level: int = 1) -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``shape`` in ``profile``, for a value at nesting
    ``level`` (the record is level 1, a payload level 2). Every subschema is inline except
    the consumer profile's ``unknown.<n>`` references (see ``unknown_definitions``)."""
    shape = effective(shape, profile)
    if isinstance(shape, Str):
        schema = _string(shape, profile)
    elif isinstance(shape, Bool):
        schema = {"type": "boolean"}
        if shape.const is not None:
            schema["const"] = shape.const
    elif isinstance(shape, Int):
        schema = {"type": "integer"}
        if shape.const is not None:
            schema["const"] = shape.const
        if shape.minimum is not None:
            schema["minimum"] = shape.minimum
        if shape.maximum is not None:
            schema["maximum"] = shape.maximum
    elif isinstance(shape, Arr):
        schema = {"type": "array", "items": to_schema(shape.items, profile, level + 1)}
        if shape.const is not None:
            schema["const"] = list(shape.const)
        if shape.contains is not None:
            schema["contains"] = {"const": shape.contains}
        if shape.min_items is not None:
            schema["minItems"] = shape.min_items
        schema["maxItems"] = MAX_ARRAY_ITEMS if shape.max_items is None else shape.max_items
    elif isinstance(shape, Obj):
        schema = _object(shape, profile, level)
    elif isinstance(shape, Nullable):
        inner = to_schema(shape.inner, profile, level)
        schema = {"anyOf": [inner, {"type": "null"}]}
    elif isinstance(shape, Union):
        schema = {"oneOf": [to_schema(variant, profile, level) for variant in shape.variants]}
    else:
        raise TypeError(f"unknown shape {shape!r}")
    return _described(schema, shape.doc)


# -- walking -----------------------------------------------------------------------------


def walk(shape: Shape, path: str = "") -> list[tuple[str, Shape]]:
    """Every shape inside ``shape`` with its dotted path (``a.b``, ``a[]``, ``a<tag>``)."""
    found: list[tuple[str, Shape]] = [(path, shape)]
    if isinstance(shape, Obj):
        for member in shape.fields:
            found += walk(member.shape, f"{path}.{member.name}" if path else member.name)
    elif isinstance(shape, Arr):
        found += walk(shape.items, f"{path}[]")
    elif isinstance(shape, Nullable):
        found += walk(shape.inner, path)
    elif isinstance(shape, Union):
        for tag, variant in zip(shape.tags(), shape.variants, strict=True):
            found += walk(variant, f"{path}<{tag}>")
    return found
