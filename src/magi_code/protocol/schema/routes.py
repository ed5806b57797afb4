"""The generated block of ``protocol/operations.py``: each operation's and event's route
facts, rendered from the declarations."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from . import definitions as v1

TARGET: Final = Path(__file__).resolve().parent.parent / "operations.py"
BEGIN: Final = "# -- generated: do not edit " + "-" * 66 + "\n"
END: Final = "# -- end of generated " + "-" * 72 + "\n"


def _operation(op: v1.Operation) -> str:
    args = [f'"{op.name}"', f'"{op.service}"']
    if op.session != "forbidden":
        args.append(f'"{op.session}"')
    if not op.gated:
        args.append("gated=False")
    return f"    DeclaredOperation({', '.join(args)}),\n"


def generated_block() -> str:
    """The block's text between its two marker lines."""
    lines = ["OPERATIONS: Final = (\n"]
    lines += [_operation(op) for op in v1.OPERATIONS]
    lines += [")\n", "EVENTS: Final = (\n"]
    lines += [f'    DeclaredEvent("{ev.name}", "{ev.service}"),\n' for ev in v1.EVENTS]
    lines.append(")\n")
    return "".join(lines)


def refreshed(text: str) -> str:
    """``text`` (the module's source) with its generated block rendered afresh."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError("the generated block's markers are missing")
    return head + BEGIN + generated_block() + END + tail
