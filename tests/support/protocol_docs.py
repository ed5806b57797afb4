"""Reference tables for ``docs/protocol/``, rendered from the v1 definitions.

The pages keep hand-written prose around generated blocks::

    <!-- generated: request:session.list -->
    ...table...
    <!-- end generated -->

``tests/unit/protocol/test_protocol_docs.py`` re-renders every block and fails (after
rewriting the page) when one is stale, so the tables cannot drift from the definitions
(which the schema tests hold to the code).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from magi_code.protocol.errors import MESSAGES, ErrorCode
from magi_code.protocol.limits import ADVERTISED_LIMITS
from magi_code.protocol.schema import definitions as v1
from magi_code.protocol.schema.model import (
    Arr,
    Bool,
    Field,
    Forbid,
    Int,
    Nullable,
    Obj,
    RequireAny,
    Shape,
    Str,
    Union,
)

DOCS: Final = Path(__file__).resolve().parents[2] / "docs" / "protocol"
BLOCK: Final = re.compile(
    r"(<!-- generated: (?P<key>[^ ]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)
STRUCTURAL_STRING = 16384
# A page's section or subsection heading.
HEADING: Final = re.compile(r"^#{2,3} ", re.M)


def _code(text: str) -> str:
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def type_text(shape: Shape) -> str:
    if isinstance(shape, Nullable):
        return f"{type_text(shape.inner)} or `null`"
    if isinstance(shape, Str):
        if shape.const is not None:
            return f"string {_code(shape.const)}"
        if shape.enum is not None:
            values = ", ".join(_code(v) for v in shape.enum)
            fallback = f" (any other value: {shape.fallback})" if shape.fallback else ""
            return f"string: {values}{fallback}"
        return "string"
    if isinstance(shape, Bool):
        return "boolean" if shape.const is None else f"boolean {_code(str(shape.const).lower())}"
    if isinstance(shape, Int):
        return "integer" if shape.const is None else f"integer {_code(str(shape.const))}"
    if isinstance(shape, Arr):
        if shape.const is not None:
            return "array " + _code(str(list(shape.const)).replace("'", '"'))
        return f"array of {type_text(shape.items)}"
    if isinstance(shape, Union):
        return f"object, by {_code(shape.tag)} (see below)"
    if isinstance(shape, Obj):
        return "object" if shape.fields or shape.closed is False else "object `{}`"
    raise TypeError(shape)


def _with_code(text: str, shape: Shape, constraint: str, request: bool) -> str:
    code = shape.code(constraint)
    late = " (checked by the operation)" if constraint in shape.late else ""
    if request and code is not ErrorCode.INVALID_PAYLOAD:
        return f"{text} → {_code(code.value)}{late}"
    return text + late


def _range_codes(
    shape: Shape, low: str, high: str, under: str, over: str, request: bool
) -> list[str]:
    """Which code each side of a range gets, when not ``invalid_payload``."""
    if not request:
        return []
    notes = []
    for constraint, word in ((low, under), (high, over)):
        if (
            getattr(shape, constraint, None)
            and shape.code(constraint) is not ErrorCode.INVALID_PAYLOAD
        ):
            notes.append(f"{word} → {_code(shape.code(constraint).value)}")
    return notes


def constraints(shape: Shape, request: bool) -> list[str]:
    if isinstance(shape, Nullable):
        return constraints(shape.inner, request)
    found: list[str] = []
    if isinstance(shape, Str):
        if shape.min_length == 1:
            found.append(_with_code("non-empty", shape, "min_length", request))
        if shape.non_blank:
            found.append(_with_code("not only whitespace", shape, "non_blank", request))
        if shape.max_length is not None:
            found.append(f"≤ {shape.max_length} characters")
        if shape.max_bytes is not None and shape.enum is None and shape.const is None:
            found.append(_with_code(f"≤ {shape.max_bytes:,} bytes", shape, "max_bytes", request))
        if shape.pattern is not None:
            found.append(_with_code(_code(shape.pattern), shape, "pattern", request))
        if shape.printable:
            found.append("printable")
        if shape.enum is not None and request:
            found.append(_with_code("one of the values", shape, "enum", request))
    elif isinstance(shape, Int) and shape.const is None:
        if shape.minimum is not None and shape.maximum is not None:
            found.append(f"{shape.minimum:,} to {shape.maximum:,}")
        elif shape.minimum is not None:
            found.append(f"≥ {shape.minimum:,}")
        found += _range_codes(shape, "minimum", "maximum", "below", "above", request)
    elif isinstance(shape, Obj) and shape.max_json_bytes is not None:
        found.append(f"≤ {shape.max_json_bytes:,} bytes as compact JSON")
    elif isinstance(shape, Arr) and shape.const is None:
        if shape.contains is not None:
            found.append(f"contains {_code(shape.contains)}")
        low, high = shape.min_items or 0, shape.max_items
        if high is not None:
            found.append(f"{low} to {high} items" if low else f"≤ {high} items")
        elif low:
            found.append(f"≥ {low} items")
        found += _range_codes(shape, "min_items", "max_items", "fewer", "more", request)
        found += [f"items: {c}" for c in constraints(shape.items, request)]
    return found


def _nested(shape: Shape) -> tuple[str, Obj] | None:
    if isinstance(shape, Nullable):
        return _nested(shape.inner)
    if isinstance(shape, Obj) and shape.fields:
        return ".", shape
    if isinstance(shape, Arr):
        inner = _nested(shape.items)
        if inner is not None:
            return "[]" + inner[0], inner[1]
    return None


def _reusable(shape: Shape) -> bool:
    return shape is v1.LIMITS or shape is v1.CAPABILITIES or shape is v1.CONFIG


def rows(obj: Obj, *, request: bool, prefix: str = "") -> Iterator[str]:
    for member in obj.fields:
        yield _row(member, request=request, prefix=prefix)
        nested = _nested(member.shape)
        if nested is not None and not _reusable(member.shape):
            yield from rows(nested[1], request=request, prefix=f"{prefix}{member.name}{nested[0]}")


def consumer_text(shape: Shape) -> str:
    """What a client accepts where a shape names a ``consumer`` replacement (its type is
    the strict one's)."""
    found = constraints(shape, request=False)
    if isinstance(shape, Arr) and isinstance(shape.items, Str) and shape.items.fallback:
        found.append(f"any other item: {shape.items.fallback}")
    return "; ".join(found)


def _replacement(shape: Shape) -> Shape | None:
    if isinstance(shape, Nullable):
        return _replacement(shape.inner)
    return shape.consumer


def _row(member: Field, *, request: bool, prefix: str) -> str:
    if member.required:
        presence = "required" if request else "always"
    else:
        presence = "optional" + (f", default {member.default}" if member.default else "")
    found = constraints(member.shape, request)
    replacement = None if request else _replacement(member.shape)
    if replacement is not None:
        found.append(f"a client accepts: {consumer_text(replacement)}")
    limits = "; ".join(found) or "—"
    doc = member.doc or member.shape.doc
    cells = [_code(prefix + member.name), type_text(member.shape), presence, limits, doc]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


HEADER: Final = (
    "| member | type | presence | bounds and rules | meaning |\n| --- | --- | --- | --- | --- |"
)


def table(obj: Obj, *, request: bool) -> str:
    if not obj.fields:
        return (
            "The payload is `{}`: no members; any member → `invalid_payload`.\n"
            if request
            else "`{}`\n"
        )
    lines = [HEADER, *rows(obj, request=request)]
    for rule in obj.rules:
        if isinstance(rule, RequireAny):
            names = ", ".join(_code(n) for n in rule.names)
            lines.append(f"\nAt least one of {names} must be present (else `{rule.code.value}`).")
        elif isinstance(rule, Forbid):
            lines.append(
                f"\n`{rule.forbidden}` must be absent when `{rule.when}` is "
                f"`{rule.value}` (else `{rule.code.value}`)."
            )
    if request:
        lines.append("\nAny other member → `invalid_payload`.")
    elif obj.unknown is not None:
        lines.append(
            f"\nA client accepts other members too, each {type_text(obj.unknown)}: "
            f"{consumer_text(obj.unknown)}."
        )
    return "\n".join(lines) + "\n"


def union(shape: Union) -> str:
    parts = []
    for tag, variant in zip(shape.tags(), shape.variants, strict=True):
        parts.append(
            f'**`{shape.tag}: "{tag}"`**: {variant.doc}\n\n{table(variant, request=False)}'
        )
    return "\n".join(parts)


def _errors(op: v1.Operation) -> str:
    if not op.errors:
        return "No operation-specific errors.\n"
    lines = ["| code | when |", "| --- | --- |"]
    lines += [f"| `{code.value}` | {_cell(when)} |" for code, when in op.errors]
    return "\n".join(lines) + "\n"


def _error_table() -> str:
    lines = ["| code | fixed message | when |", "| --- | --- | --- |"]
    for code in ErrorCode:
        lines.append(f"| `{code.value}` | {_cell(MESSAGES[code])} | {_cell(v1.ERROR_DOCS[code])} |")
    return "\n".join(lines) + "\n"


def _limit_table() -> str:
    lines = ["| limit | value | bounds |", "| --- | --- | --- |"]
    for name, value in ADVERTISED_LIMITS.items():
        lines.append(f"| `{name}` | {value:,} | {_cell(v1.LIMIT_DOCS[name])} |")
    return "\n".join(lines) + "\n"


def _operation_summary() -> str:
    lines = ["| operation | area | outer `session_id` | before `initialize` | what it does |"]
    lines.append("| --- | --- | --- | --- | --- |")
    session = {"forbidden": "must be absent", "required": "required", "optional": "optional"}
    for op in v1.OPERATIONS:
        gate = "allowed" if not op.gated else "`not_initialized`"
        lines.append(
            f"| [`{op.name}`](operations.md#{op.name.replace('.', '')}) | {op.area} | "
            f"{session[op.session]} | {gate} | {_cell(op.summary)} |"
        )
    return "\n".join(lines) + "\n"


def _event_summary() -> str:
    lines = ["| event | stream | what it says |", "| --- | --- | --- |"]
    for ev in v1.EVENTS:
        lines.append(
            f"| [`{ev.name}`](events.md#{ev.name.replace('.', '')}) | {ev.stream} | "
            f"{_cell(ev.summary)} |"
        )
    return "\n".join(lines) + "\n"


def render(key: str) -> str:
    kind, _, name = key.partition(":")
    if kind == "request":
        return table(v1.operation(name).request, request=True)
    if kind == "response":
        return table(v1.operation(name).response, request=False)
    if kind == "operation-errors":
        return _errors(v1.operation(name))
    if kind == "event":
        payload = v1.event(name).payload
        return union(payload) if isinstance(payload, Union) else table(payload, request=False)
    if kind == "envelope":
        shape = {
            "request": v1.REQUEST_ENVELOPE,
            "response": v1.RESPONSE_ENVELOPE,
            "event": v1.EVENT_ENVELOPE,
            "error": v1.ERROR,
        }[name]
        return table(shape, request=False)
    if kind == "shape":
        shape = {
            "limits": v1.LIMITS,
            "capabilities": v1.CAPABILITIES,
            "config": v1.CONFIG,
            "activity-capabilities": v1.ACTIVITY_CAPABILITIES,
        }[name]
        return table(shape, request=False)
    if kind == "union":
        return union({"activity": v1.ACTIVITY, "replay-item": v1.REPLAY_ITEM}[name])
    if key == "errors":
        return _error_table()
    if key == "limits":
        return _limit_table()
    if key == "operations":
        return _operation_summary()
    if key == "events":
        return _event_summary()
    raise KeyError(key)


def refreshed(text: str) -> str:
    """``text`` with every generated block re-rendered."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("key")) + m.group(4), text)


def with_every_operation(text: str) -> str:
    """``operations.md``'s ``text`` with a section for each declared operation it lacks:
    its heading, summary and generated blocks, after the section of the operation declared
    before it (for prose to be added there)."""
    for index, op in enumerate(v1.OPERATIONS):
        if _heading(op.name) in text:
            continue
        section = f"{_heading(op.name)}\n{op.summary}\n\n" + "".join(
            f"{title}:\n\n<!-- generated: {kind}:{op.name} -->\n<!-- end generated -->\n\n"
            for title, kind in (
                ("Request", "request"),
                ("Response", "response"),
                ("Errors", "operation-errors"),
            )
        )
        before = [o for o in v1.OPERATIONS[:index] if _heading(o.name) in text]
        if before:
            found = HEADING.search(text, text.index(_heading(before[-1].name)) + 1)
            at = found.start() if found else len(text)
        else:
            at = text.index("### ")
        text = text[:at] + section + text[at:]
    return text


def _heading(name: str) -> str:
    return f"### `{name}`\n"


def keys(text: str) -> list[str]:
    return [m.group("key") for m in BLOCK.finditer(text)]
