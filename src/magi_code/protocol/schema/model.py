"""A small declarative model of JSON payload shapes, and its JSON Schema (2020-12) form.

The v1 definitions (``definitions.py``) are written in these terms once; the schema
documents, the reference tables in ``docs/protocol/`` and the tests that hold the
request validators to the definitions all read them.

Shapes describe JSON values: :class:`Str`, :class:`Int`, :class:`Bool`, :class:`Arr`,
:class:`Obj` (with :class:`Field` members), :class:`Nullable` and :class:`Union` (a
tagged choice of objects). Every constraint of a *request* shape names the error code a
violation gets (``codes``, default ``invalid_payload``); constraints listed in ``late``
are checked by the operation itself after the payload validator, which lets them pass.

Byte bounds are UTF-8 bounds. JSON Schema can only count code points, so a byte bound
is rendered as ``maxLength`` (a code point is at least one byte, so this is implied)
plus the annotation ``x-max-utf8-bytes``; ``x-printable`` marks identifiers that must be
printable (Python's ``str.isprintable``), and ``x-open-enum`` marks enumerations a consumer
must expect to grow. Validators that do not know these annotations ignore them; the
project's tests check the first two as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from magi_code.dataclass import dataclass, field
from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.limits import MAX_ARRAY_ITEMS, MAX_OBJECT_FIELDS, MAX_STRING_BYTES

INVALID: Final = ErrorCode.INVALID_PAYLOAD
MAX_UTF8_BYTES: Final = "x-max-utf8-bytes"
PRINTABLE: Final = "x-printable"
OPEN_ENUM: Final = "x-open-enum"


@dataclass(frozen=True, kw_only=True)
class Shape:
    doc: str = ""
    # constraint name -> the error code a violation gets (requests only).
    codes: Mapping[str, ErrorCode] = field(default_factory=dict)
    # constraints the operation checks after its payload validator.
    late: frozenset[str] = frozenset()
    # attribute -> where the code defines its value (``module:NAME``, or
    # ``module:function.parameter`` for a parameter's ``Literal`` type); a test resolves
    # each one and compares.
    sources: Mapping[str, str] = field(default_factory=dict)

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
    # ``enum`` lists what this version sends; consumers must tolerate other values.
    open_enum: bool = False
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
class Obj(Shape):
    fields: tuple[Field, ...] = ()
    closed: bool = True
    rules: tuple[RequireAny | Forbid, ...] = ()
    # Raw JSON Schema keywords added as they are (cross-member rules of envelopes).
    extra: Mapping[str, Any] = field(default_factory=dict)

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
    open_tag: bool = False  # consumers must tolerate unknown tags

    def tags(self) -> list[str]:
        tags = []
        for variant in self.variants:
            shape = variant.member(self.tag).shape
            assert isinstance(shape, Str) and shape.const is not None
            tags.append(shape.const)
        return tags


# -- JSON Schema -------------------------------------------------------------------------


def _string(shape: Str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if shape.const is not None:
        schema["const"] = shape.const
    if shape.enum is not None:
        schema["enum"] = list(shape.enum)
        if shape.open_enum:
            schema[OPEN_ENUM] = True
    if shape.min_length is not None:
        schema["minLength"] = shape.min_length
    if shape.max_length is not None:
        schema["maxLength"] = shape.max_length
    limit = MAX_STRING_BYTES if shape.max_bytes is None else shape.max_bytes
    if shape.const is None and shape.enum is None:
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


def _object(shape: Obj) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: _described(to_schema(f.shape), f.doc) for f in shape.fields},
        "required": [f.name for f in shape.fields if f.required],
    }
    if shape.closed:
        schema["additionalProperties"] = False
    else:
        schema["maxProperties"] = MAX_OBJECT_FIELDS
    conditions: list[dict[str, Any]] = []
    for rule in shape.rules:
        if isinstance(rule, RequireAny):
            schema["anyOf"] = [{"required": [name]} for name in rule.names]
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
    schema.update(shape.extra)
    return schema


def _described(schema: dict[str, Any], doc: str) -> dict[str, Any]:
    return {"description": doc, **schema} if doc else schema


def to_schema(shape: Shape) -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``shape``, every subschema inline."""
    if isinstance(shape, Str):
        schema = _string(shape)
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
        schema = {"type": "array", "items": to_schema(shape.items)}
        if shape.const is not None:
            schema["const"] = list(shape.const)
        if shape.min_items is not None:
            schema["minItems"] = shape.min_items
        schema["maxItems"] = MAX_ARRAY_ITEMS if shape.max_items is None else shape.max_items
    elif isinstance(shape, Obj):
        schema = _object(shape)
    elif isinstance(shape, Nullable):
        inner = to_schema(shape.inner)
        schema = {"anyOf": [inner, {"type": "null"}]}
    elif isinstance(shape, Union):
        schema = {"oneOf": [to_schema(variant) for variant in shape.variants]}
        if shape.open_tag:
            schema[OPEN_ENUM] = shape.tag
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
