"""What a turn's frontend does for its tools: the details of each call it wants to show,
and, for an editor, the file access that sees its unsaved buffers.

Both are optional fields of :class:`~magi_code.tools.base.ToolContext`, set by the core for
a persistent client that asked for them (RFC-0002 §6.8); without them the tools behave as
they always did. The details are for that frontend only: they never reach v1 output, the
turn's activity or the session's history.

Everything here is bounded: an argument summary keeps at most :data:`MAX_ARGUMENTS`
arguments of at most :data:`MAX_ARGUMENT_BYTES` each; a diff at most
:data:`MAX_DIFF_TEXT_BYTES` of the old and of the new text; a file read or written through
the editor at most :data:`MAX_EDITOR_FILE_BYTES`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

from magi_code.dataclass import dataclass
from magi_code.protocol.text import truncate_utf8

from .base import ToolInputError, parse_arguments
from .paths import display_path, project_root, resolve_in_project

MAX_ARGUMENTS: Final = 32
MAX_ARGUMENT_BYTES: Final = 1024
MAX_DIFF_TEXT_BYTES: Final = 64 * 1024
# What one v2 frame can carry with room to spare (its body is at most 1 MiB).
MAX_EDITOR_FILE_BYTES: Final = 768 * 1024
# The built-in tools whose ``path`` argument names a project file or directory.
PATH_TOOLS: Final = frozenset({"read_file", "write_file", "edit_file", "list_files", "grep"})

# Takes one detail: ``{"call": {...}}`` or ``{"diff": {...}}`` (the core adds the call's ID).
DetailSink = Callable[[dict[str, Any]], None]


class EditorFailed(Exception):
    """The editor did not read or write the file; ``str(exc)`` is for the model."""


class EditorFiles(Protocol):
    """The editor's file system (paths are project-relative, as the tools show them)."""

    @property
    def reads(self) -> bool:
        """The editor reads files for the tools (its buffers, saved or not)."""

    @property
    def writes(self) -> bool:
        """The editor writes files for the tools (into its buffers and undo history)."""

    async def read_text(self, path: str) -> str:
        """The file's text as the editor has it; raises :class:`EditorFailed`."""

    async def write_text(self, path: str, content: str) -> None:
        """Replace the file's text in the editor; raises :class:`EditorFailed`."""


@dataclass(frozen=True, slots=True)
class Frontend:
    """What a turn's frontend asked for; nothing by default."""

    details: DetailSink | None = None
    editor: EditorFiles | None = None


def call_detail(name: str, raw_arguments: str, project_dir: Path) -> dict[str, Any] | None:
    """A call's detail: the tool, a bounded argument summary and the project paths it
    names (``locations``; a path outside the project is not one); None for arguments the
    tool will refuse anyway. Blocking (resolves paths)."""
    try:
        arguments = parse_arguments(raw_arguments)
        root = project_root(project_dir)
    except ToolInputError:
        return None
    summary: dict[str, Any] = {}
    truncated = len(arguments) > MAX_ARGUMENTS
    for key, value in list(arguments.items())[:MAX_ARGUMENTS]:
        if isinstance(value, bool | int | float) or value is None:
            summary[key] = value
            continue
        text, cut = truncate_utf8(
            value if isinstance(value, str) else repr(value), MAX_ARGUMENT_BYTES
        )
        summary[key], truncated = text, truncated or cut
    locations: list[dict[str, Any]] = []
    raw = arguments.get("path")
    if name in PATH_TOOLS and isinstance(raw, str) and raw:
        try:
            location: dict[str, Any] = {"path": display_path(root, resolve_in_project(root, raw))}
        except ToolInputError:
            pass
        else:
            offset = arguments.get("offset")
            if name == "read_file" and isinstance(offset, int) and not isinstance(offset, bool):
                location["line"] = offset
            locations.append(location)
    return {"tool": name, "arguments": summary, "truncated": truncated, "locations": locations}


def report_diff(details: DetailSink | None, path: str, old: str | None, new: str) -> None:
    """A file change the frontend may show: the project-relative path, the text before
    (None for a new file) and after, each bounded."""
    if details is None:
        return
    new_text, new_cut = truncate_utf8(new, MAX_DIFF_TEXT_BYTES)
    old_text, old_cut = (None, False) if old is None else truncate_utf8(old, MAX_DIFF_TEXT_BYTES)
    diff = {"path": path, "old_text": old_text, "new_text": new_text}
    details({"diff": {**diff, "truncated": old_cut or new_cut}})


def editor_text_fits(text: str, shown: str) -> None:
    """Refuse a text too large to go through the editor connection."""
    if len(text.encode("utf-8")) > MAX_EDITOR_FILE_BYTES:
        raise ToolInputError(f"{shown} is too large to edit through the editor.")
