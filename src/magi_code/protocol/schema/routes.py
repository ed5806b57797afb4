"""The generated block of ``protocol/operations.py``: each operation's and event's route
facts and each operation's request shape in the form ``protocol/payloads.py`` checks,
rendered from the declarations."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Final

from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.payloads import Member, Rule, Value

from . import definitions as v1
from .model import Arr, Bool, Forbid, Int, Nullable, Obj, RequireAny, Shape, Str

TARGET: Final = Path(__file__).resolve().parent.parent / "operations.py"
BEGIN: Final = "# -- generated: do not edit " + "-" * 66 + "\n"
END: Final = "# -- end of generated " + "-" * 72 + "\n"
WIDTH: Final = 100
# The default payload of ``DeclaredOperation``: an empty object.
EMPTY: Final = Value(type="object")


def _codes(shape: Shape) -> tuple[tuple[str, ErrorCode], ...]:
    return tuple(
        (name, code)
        for name, code in shape.codes.items()
        if code is not ErrorCode.INVALID_PAYLOAD and name not in shape.late
    )


def _unchecked(shape: Shape, names: tuple[str, ...]) -> None:
    """Refuse what ``protocol/payloads.py`` does not check (a request shape using it needs
    that check written there first)."""
    for name in names:
        if getattr(shape, name) not in (None, False, ()):
            raise TypeError(f"a request shape's {name!r} is not checked: {shape!r}")


def request_value(shape: Shape, nullable: bool = False) -> Value:
    """``shape`` (a request shape) as ``protocol/payloads.py`` checks it; constraints the
    handler checks (``late``) are left out."""
    late = shape.late
    if isinstance(shape, Nullable):
        return request_value(shape.inner, nullable=True)
    if isinstance(shape, Str):
        _unchecked(shape, ("const", "printable", "format"))

        def kept(name: str, value: Any) -> Any:
            return None if name in late else value

        return Value(
            type="string",
            nullable=nullable,
            codes=_codes(shape),
            enum=kept("enum", shape.enum),
            min_length=kept("min_length", shape.min_length),
            max_length=kept("max_length", shape.max_length),
            max_bytes=kept("max_bytes", shape.max_bytes),
            pattern=kept("pattern", shape.pattern),
            non_blank=shape.non_blank and "non_blank" not in late,
        )
    if isinstance(shape, Int):
        _unchecked(shape, ("const",))
        return Value(
            type="integer",
            nullable=nullable,
            codes=_codes(shape),
            minimum=shape.minimum,
            maximum=shape.maximum,
        )
    if isinstance(shape, Bool):
        _unchecked(shape, ("const",))
        return Value(type="boolean", nullable=nullable, codes=_codes(shape))
    if isinstance(shape, Arr):
        _unchecked(shape, ("const", "contains"))
        return Value(
            type="array",
            nullable=nullable,
            codes=_codes(shape),
            items=request_value(shape.items),
            min_items=shape.min_items,
            max_items=shape.max_items,
        )
    if isinstance(shape, Obj):
        if not shape.closed:
            raise TypeError(f"a request object is closed: {shape!r}")
        return Value(
            type="object",
            nullable=nullable,
            codes=_codes(shape),
            members=tuple(
                Member(name=f.name, value=request_value(f.shape), required=f.required)
                for f in shape.fields
            ),
            rules=tuple(_rule(rule) for rule in shape.rules),
            by_constraint=shape.by_constraint,
            order=shape.check_order,
        )
    raise TypeError(f"a request shape cannot be {shape!r}")


def _rule(rule: object) -> Rule:
    if isinstance(rule, RequireAny):
        return Rule(names=rule.names, code=rule.code)
    if isinstance(rule, Forbid):
        return Rule(names=(rule.forbidden,), when=rule.when, equals=rule.value, code=rule.code)
    raise TypeError(f"a request object cannot have the rule {rule!r}")


# -- rendering as Python source --------------------------------------------------------------


def _render(value: Any, indent: int, prefix: int = 0) -> str:
    """``value`` as a Python expression on a line indented by ``indent`` after ``prefix``
    other characters (split over lines, one item a line, where it does not fit)."""
    flat = _flat(value)
    fits = indent + prefix + len(flat) + 1 <= WIDTH
    if fits or not isinstance(value, tuple | Value | Member | Rule):
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, tuple):
        items = [_render(item, indent + 4) for item in value]
        return "(\n" + "".join(f"{pad}{item},\n" for item in items) + " " * indent + ")"
    args = [f"{name}={_render(v, indent + 4, len(name) + 1)}" for name, v in _arguments(value)]
    return f"{type(value).__name__}(\n" + "".join(f"{pad}{a},\n" for a in args) + " " * indent + ")"


def _arguments(value: Value | Member | Rule) -> list[tuple[str, Any]]:
    """The arguments that differ from the defaults."""
    found = []
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if f.default is dataclasses.MISSING or v != f.default:
            found.append((f.name, v))
    return found


def _flat(value: Any) -> str:
    if isinstance(value, Value | Member | Rule):
        args = ", ".join(f"{name}={_flat(v)}" for name, v in _arguments(value))
        return f"{type(value).__name__}({args})"
    if isinstance(value, tuple):
        items = [_flat(item) for item in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, ErrorCode):
        return f"ErrorCode.{value.name}"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _operation(op: v1.Operation) -> str:
    args = [f'"{op.name}"', f'"{op.service}"']
    if op.session != "forbidden":
        args.append(f'"{op.session}"')
    if not op.gated:
        args.append("gated=False")
    if op.checks_session:
        args.append("checks_session=True")
    if op.session_first:
        args.append("session_first=True")
    payload = request_value(op.request)
    if payload != EMPTY:
        args.append(f"payload={_render(payload, 8, len('payload='))}")
    flat = f"    DeclaredOperation({', '.join(args)}),"
    if "\n" not in flat and len(flat) <= WIDTH:
        return flat + "\n"
    return "    DeclaredOperation(\n" + "".join(f"        {a},\n" for a in args) + "    ),\n"


def generated_block() -> str:
    """The block's text between its two marker lines."""
    # The envelope already bounded it; only its pattern is left.
    session = Value(
        type="string",
        pattern=v1.SESSION_ID_PATTERN,
        codes=(("pattern", ErrorCode.INVALID_SESSION_ID),),
    )
    lines = [
        "# fmt: off\n",
        "# What a session ID is, for an operation that checks its outer ``session_id``.\n",
        f"SESSION_ID: Final = {_render(session, 0, len('SESSION_ID: Final = '))}\n",
        "OPERATIONS: Final = (\n",
    ]
    lines += [_operation(op) for op in v1.OPERATIONS]
    lines += [")\n", "EVENTS: Final = (\n"]
    lines += [f'    DeclaredEvent("{ev.name}", "{ev.service}"),\n' for ev in v1.EVENTS]
    lines += [")\n", "# fmt: on\n"]
    return "".join(lines)


def refreshed(text: str) -> str:
    """``text`` (the module's source) with its generated block rendered afresh."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError("the generated block's markers are missing")
    return head + BEGIN + generated_block() + END + tail
