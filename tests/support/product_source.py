"""The product's modules parsed once per test process, for the tests that read its source
(the layering, imports and spellings it must not use): parsing every module takes about a
second, and each of those tests would otherwise do it again."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import magi_code

ROOT = Path(magi_code.__file__).parent


@functools.cache
def parsed_modules() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the package, sorted by path, with its syntax tree (read-only)."""
    return tuple((path, ast.parse(path.read_text())) for path in sorted(ROOT.rglob("*.py")))
