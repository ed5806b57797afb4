"""Confining model-supplied paths to the launch project, and glob matching.

Every file tool path resolves inside the project directory: relative paths are taken
from the project root, absolute paths are accepted only when they land inside it, and
symlinks are resolved before the check, so ``..`` and links pointing outside are refused.
This guards against model mistakes, not a hostile local user: the shell tool runs
arbitrary commands anyway.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from magi_code.tools.base import ToolInputError

SKIPPED_DIRS: Final = frozenset({".git"})


def project_root(project_dir: Path) -> Path:
    try:
        return project_dir.resolve(strict=True)
    except OSError:
        raise ToolInputError("The project directory is not available.") from None


def resolve_in_project(root: Path, raw: str) -> Path:
    """The real path ``raw`` names, refusing anything outside ``root`` (itself resolved)."""
    if not raw or "\0" in raw:
        raise ToolInputError("The path is empty or invalid.")
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


def walk(base: Path, *, max_depth: int | None = None) -> Iterator[tuple[str, bool]]:
    """``(relative posix path, is_dir)`` under ``base``, sorted per directory: a
    directory's entries (directories first), then each subdirectory's, depth first.

    Never follows directory symlinks (they are listed, not entered), skips ``.git`` and
    unreadable directories. Strings only (no ``Path`` per entry): a listing is on the
    tool loop's path.
    """
    return _walk(os.fspath(base), "", 0, max_depth)


def _walk(top: str, prefix: str, depth: int, max_depth: int | None) -> Iterator[tuple[str, bool]]:
    try:
        with os.scandir(top) as scan:
            entries = list(scan)
    except OSError:
        return
    dirs: list[str] = []
    files: list[str] = []
    links: set[str] = set()
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            files.append(entry.name)
        elif entry.name not in SKIPPED_DIRS:
            dirs.append(entry.name)
            with contextlib.suppress(OSError):
                if entry.is_symlink():
                    links.add(entry.name)
    dirs.sort()
    files.sort()
    for name in dirs:
        yield prefix + name, True
    for name in files:
        yield prefix + name, False
    if max_depth is not None and depth >= max_depth:
        return
    for name in dirs:
        if name not in links:
            yield from _walk(os.path.join(top, name), f"{prefix}{name}/", depth + 1, max_depth)
