"""The built-in tools every turn offers, and the allowlist of their names.

``BUILTIN_TOOL_NAMES`` is what the activity projection may show as a raw ``tool_name``;
every other tool (MCP) is reported by hash only.
"""

from __future__ import annotations

from typing import Final

from magi_code.tools.base import Tool
from magi_code.tools.files import EditFile, Grep, ListFiles, ReadFile, WriteFile
from magi_code.tools.shell import Shell

BUILTIN_TOOLS: Final[tuple[Tool, ...]] = (
    ReadFile(),
    WriteFile(),
    EditFile(),
    ListFiles(),
    Grep(),
    Shell(),
)
BUILTIN_TOOL_NAMES: Final = frozenset(tool.name for tool in BUILTIN_TOOLS)

__all__ = [
    "BUILTIN_TOOLS",
    "BUILTIN_TOOL_NAMES",
    "EditFile",
    "Grep",
    "ListFiles",
    "ReadFile",
    "Shell",
    "WriteFile",
]
