"""Startup instructions: the base system prompt, the project's instruction files, and the
list of skills (names and descriptions; the bodies are loaded with the ``skill`` tool)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from magi_code.storage.launch import inside_project

from .skills import SkillCatalog, prompt_section

BASE_PROMPT: Final = (
    "You are magi-code, a coding agent working in the user's project directory. "
    "Use the tools to read, search, edit and run code; keep answers concise and say what "
    "you changed."
)
# Instruction files, in order; each is read with a bounded read, from a directory that
# resolves inside the project (a ``.magi-code`` symlink leading out of it is not followed).
INSTRUCTION_FILES: Final = ("AGENTS.md", ".magi-code/instructions.md", ".magi-code/AGENTS.md")
# As paths made once: pathlib interns every part of a path, and a part split anew for
# each turn, interned and freed again, leaves slots in CPython's table of interned strings
# behind until the table is rebuilt larger (~1 MiB, for the daemon's life).
_RELATIVE: Final = tuple((name, Path(name)) for name in INSTRUCTION_FILES)
MAX_INSTRUCTION_BYTES: Final = 64 * 1024


def _read_bounded(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}") and not path.is_file():
            return None
        data = os.read(fd, MAX_INSTRUCTION_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip() or None


def system_prompt(project_dir: Path, skills: SkillCatalog | None = None) -> str:
    sections = [BASE_PROMPT]
    for name, relative in _RELATIVE:
        directory = inside_project(project_dir, relative.parent)
        text = None if directory is None else _read_bounded(directory / relative.name)
        if text:
            sections.append(f"# Project instructions ({name})\n\n{text}")
    if skills is not None and (listing := prompt_section(skills)):
        sections.append(listing)
    return "\n\n".join(sections)
