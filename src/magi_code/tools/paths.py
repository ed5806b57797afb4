"""Confining model-supplied paths to the launch project, and glob matching.

Every file tool path resolves inside the project directory: relative paths are taken
from the project root, absolute paths are accepted only when they land inside it, and
symlinks are resolved before the check, so ``..`` and links pointing outside are refused.
This guards against model mistakes, not a hostile local user: the shell tool runs
arbitrary commands anyway.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from magi_code.tools.base import ToolInputError


def project_root(project_dir: Path) -> Path:
    try:
        return project_dir.resolve(strict=True)
    except OSError:
        raise ToolInputError("The project directory is not available.") from None


def check_raw_path(raw: str) -> None:
    if not raw or "\0" in raw:
        raise ToolInputError("The path is empty or invalid.")


def resolve_in_project(root: Path, raw: str) -> Path:
    """The real path ``raw`` names, refusing anything outside ``root`` (itself resolved)."""
    check_raw_path(raw)
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = Path(os.path.realpath(candidate))
    if resolved != root and not resolved.is_relative_to(root):
        raise ToolInputError("The path is outside the project directory.")
    return resolved


def display_path(root: Path, path: Path) -> str:
    """``path`` relative to the project root, as the model should refer to it."""
    relative = path.relative_to(root).as_posix()
    return relative if relative != "." else "."


@functools.lru_cache(maxsize=256)  # a tool loop repeats its patterns
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a glob over ``/``-separated relative paths.

    ``*`` and ``?`` stay within one path segment, ``**/`` spans zero or more directories,
    ``[...]``/``[!...]`` are character classes, ``{a,b}`` alternatives (not nested).
    """
    return re.compile(_translate(pattern) + r"\Z", re.DOTALL)


def _translate(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            if body.startswith("!"):
                body = "^/" + body[1:]
            out.append(f"[{body}]")
            i = end + 1
        elif char == "{" and (end := pattern.find("}", i)) != -1:
            alternatives = pattern[i + 1 : end].split(",")
            out.append("(?:" + "|".join(_translate(alt) for alt in alternatives) + ")")
            i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


def validate_glob(pattern: str) -> None:
    if not pattern or "\0" in pattern:
        raise ToolInputError("The pattern must not be empty.")
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ToolInputError("The pattern must be relative and must not contain '..'.")


def glob_depth(pattern: str) -> int | None:
    """How many directory levels a pattern can reach, or ``None`` for unbounded."""
    if "**" in pattern or "{" in pattern:
        return None
    return pattern.count("/")
