"""The tool contract the agent loop executes model tool calls through.

A tool never raises for a bad call: invalid arguments and expected failures become a
``ToolOutcome`` with ``is_error=True`` and a short message for the model. ``run_tool`` is
the one boundary that parses the model's argument JSON and turns any unexpected exception
into an error outcome; ``asyncio.CancelledError`` always propagates so a cancelled turn
stops promptly.

Tool output is for the model only. It is bounded here, once, for every tool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar

import orjson

from magi_code.dataclass import dataclass, field

if TYPE_CHECKING:
    from magi_code.tools.frontend import DetailSink, EditorFiles
    from magi_code.tools.sandbox import Sandbox

logger = logging.getLogger(__name__)

MAX_OUTPUT_BYTES: Final = 32 * 1024
TRUNCATION_MARKER: Final = "\n[output truncated]"
# Model-written arguments larger than this are refused before parsing (write_file content
# is the only large argument and files beyond this are not sensible single writes).
MAX_ARGUMENTS_BYTES: Final = 8 * 1024 * 1024

_T = TypeVar("_T")


def bound_text(text: str, limit: int = MAX_OUTPUT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marker included, on a character edge."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    marker = TRUNCATION_MARKER.encode()
    head = data[: max(0, limit - len(marker))].decode("utf-8", errors="ignore")
    return head + TRUNCATION_MARKER


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What goes back to the model for one tool call.

    ``timed_out`` is ``None`` when the tool has no notion of a timeout (the activity
    projection maps it to ``timed_out: null``, which means unknown, not false).
    """

    output: str
    is_error: bool = False
    timed_out: bool | None = None

    def __post_init__(self) -> None:
        bounded = bound_text(self.output)
        if bounded is not self.output:
            object.__setattr__(self, "output", bounded)

    @classmethod
    def error(cls, message: str, *, timed_out: bool | None = None) -> ToolOutcome:
        return cls(output=message, is_error=True, timed_out=timed_out)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Where and with what environment a tool runs.

    ``env`` is the launch environment of the client the turn belongs to; children get
    ``child_environment(env, secret_names=secret_names)``, never ``env`` itself.
    ``secret_names`` are extra credential variable names (custom providers' ``api_key_env``).
    ``umask`` is the client's file-mode creation mask, for the processes tools start and the
    files and directories they create; ``None`` means this process's own. ``sandbox`` is
    where shell and hook commands run (``tools.sandbox``); ``None``: unconfined. ``details``
    and ``editor`` are what the turn's frontend asked for (``tools.frontend``), else ``None``.
    """

    project_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    secret_names: frozenset[str] = frozenset()
    umask: int | None = None
    sandbox: Sandbox | None = None
    details: DetailSink | None = field(default=None, compare=False, repr=False)
    editor: EditorFiles | None = field(default=None, compare=False, repr=False)


class Tool(Protocol):
    """One tool the model can call. ``parameters`` is the JSON schema the model sees."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, object]: ...

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome: ...


class WrappedTool:
    """A tool around another: the same name, description and parameters, and every other
    attribute (``server_name``, ``tool_name`` of MCP tools) the wrapped tool's; a
    subclass defines ``run`` around ``self._tool.run``."""

    def __init__(self, tool: Tool) -> None:
        self._tool = tool

    @property
    def name(self) -> str:
        return self._tool.name

    @property
    def description(self) -> str:
        return self._tool.description

    @property
    def parameters(self) -> Mapping[str, object]:
        return self._tool.parameters

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return getattr(self._tool, attribute)


class ToolInputError(Exception):
    """A call the model got wrong; ``str(exc)`` is a short message written for the model."""


class BuiltinTool(ABC):
    """A tool whose expected failures are raised as ``ToolInputError`` inside ``execute``."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[Mapping[str, object]]
    # Only reads the project: calls of one reply may run at the same time (and in any
    # order) without changing what any of them sees.
    read_only: ClassVar[bool] = False

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        try:
            return await self.execute(arguments, ctx)
        except ToolInputError as exc:
            return ToolOutcome.error(str(exc))

    @abstractmethod
    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        """Run the call; raise ``ToolInputError`` for anything the model should correct."""


async def run_tool(tool: Tool, raw_arguments_json: str, ctx: ToolContext) -> ToolOutcome:
    """Parse the model's argument text and run ``tool``; never raises except on cancellation."""
    try:
        arguments = parse_arguments(raw_arguments_json)
        return await tool.run(arguments, ctx)
    except ToolInputError as exc:
        return ToolOutcome.error(str(exc))
    # The one boundary: a tool bug must not end the turn.
    except Exception as exc:  # noqa: BLE001
        # Only the type: exception text can carry paths or server output.
        logger.warning("tool call failed unexpectedly (%s)", type(exc).__name__)
        return ToolOutcome.error(f"The tool failed unexpectedly ({type(exc).__name__}).")


async def run_named_tool(
    tools: Mapping[str, Tool], name: str, raw_arguments_json: str, ctx: ToolContext
) -> ToolOutcome:
    """``run_tool`` for a model-chosen name; an unknown name is an error for the model."""
    tool = tools.get(name)
    if tool is None:
        return ToolOutcome.error("Unknown tool. Use one of the tools listed for this turn.")
    return await run_tool(tool, raw_arguments_json, ctx)


def parse_arguments(raw: str) -> Mapping[str, object]:
    """The argument object of a tool call; empty text means no arguments."""
    if len(raw) > MAX_ARGUMENTS_BYTES:
        raise ToolInputError("The tool arguments are too large.")
    if not raw.strip():
        return {}
    try:
        value = _loads(raw)
    except (ValueError, RecursionError):
        raise ToolInputError("The tool arguments are not valid JSON.") from None
    if not isinstance(value, dict):
        raise ToolInputError("The tool arguments must be a JSON object.")
    return value


# orjson reads the usual small object ten times faster than json and to the same value,
# except that it refuses some text json takes (NaN, Infinity, lone surrogates, deep
# nesting: json decides those) and reads an integer of 19 digits or more as a float.
_LONG_NUMBER: Final = re.compile(r"\d{19}")


def _loads(raw: str) -> object:
    """``json.loads(raw)``, faster."""
    if _LONG_NUMBER.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def require_str(arguments: Mapping[str, object], key: str, *, allow_empty: bool = False) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        raise ToolInputError(f"'{key}' is required and must be a string.")
    if not allow_empty and not value:
        raise ToolInputError(f"'{key}' must not be empty.")
    return value


def optional_str(arguments: Mapping[str, object], key: str) -> str | None:
    value = arguments.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ToolInputError(f"'{key}' must be a string.")
    return value


def optional_int(
    arguments: Mapping[str, object], key: str, *, default: int, minimum: int, maximum: int
) -> int:
    value = arguments.get(key)
    if value is None:
        return default
    # bool is an int subclass; JSON true is not a count. Integral floats (3.0) are accepted.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolInputError(f"'{key}' must be an integer.")
    if isinstance(value, float):
        if not value.is_integer():
            raise ToolInputError(f"'{key}' must be an integer.")
        value = int(value)
    if not minimum <= value <= maximum:
        raise ToolInputError(f"'{key}' must be between {minimum} and {maximum}.")
    return value


def optional_bool(arguments: Mapping[str, object], key: str, *, default: bool) -> bool:
    value = arguments.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ToolInputError(f"'{key}' must be a boolean.")
    return value


async def shielded(awaitable: Awaitable[_T]) -> _T:
    """Await cleanup to completion even if the caller is cancelled meanwhile.

    The cleanup itself must be bounded. A cancellation that arrives during it is
    re-raised once the cleanup has finished, so no process or pipe is left behind.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result
