"""Hooks: commands from the settings run at fixed points of a turn.

Theory of operation: ``hooks`` in the settings lists, per event, entries of
``{"matcher", "command", "timeout_ms"}``. A turn builds one :class:`TurnHooks` from the
settings it captured at admission: the global file's hooks, then the project file's, which
the settings hold only when the global ``trusted_projects`` names the project directory (a
cloned repository's settings must not run commands on their own; ``config.settings``).
The events:

- ``user_prompt_submit``: before the first provider request, with the prompt;
- ``pre_tool_use``: before a tool call whose name the matcher matches, with the tool name
  and arguments. Exit code :data:`BLOCK_EXIT_CODE` blocks the call: the tool never runs,
  and the hook's stdout (bounded) goes back to the model as the call's error result;
- ``post_tool_use``: after such a call, with its result;
- ``stop``: when the agent has given its final answer, with that text.

Each hook runs like the shell tool, through its helpers (``tools.shell.run_shell``): in
the project directory, with the stripped child environment, under the frontend's umask,
in a process group of its own that is killed on timeout, on cancellation and when the
hook exits, in the turn's sandbox when it has one. The event's JSON arrives on stdin (an
open private temporary file, so any size works and the hook reads at its own pace);
stderr is discarded. Every run is one ``lifecycle`` activity with category ``hook`` and
its end state; the projection never sees the command, the event or the output.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import itertools
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from magi_code.config.schema import HOOK_EVENTS
from magi_code.config.settings import HookDefinition, HookTable, Settings
from magi_code.dataclass import dataclass
from magi_code.tools.base import (
    Tool,
    ToolContext,
    ToolInputError,
    ToolOutcome,
    WrappedTool,
    bound_text,
)
from magi_code.tools.environment import child_environment
from magi_code.tools.paths import project_root
from magi_code.tools.processes import ChildLimitReached
from magi_code.tools.shell import run_shell

from . import activity

log = logging.getLogger(__name__)

# A pre_tool_use hook that exits with this code blocks the call.
BLOCK_EXIT_CODE: Final = 2
# The most of a blocking hook's stdout the model sees.
MAX_BLOCK_MESSAGE_BYTES: Final = 8 * 1024
BLOCKED_PREFIX: Final = "Blocked by a pre_tool_use hook"


class ActivitySink(Protocol):
    def activity(self, payload: dict[str, Any]) -> None:
        """Offer one activity; never blocks."""


def active_hooks(settings: Settings) -> dict[str, tuple[HookDefinition, ...]]:
    """The hooks a turn runs, by event: global first, then the (trusted) project's."""
    table = {
        event: settings.global_hooks.get(event, ()) + settings.project_hooks.get(event, ())
        for event in HOOK_EVENTS
    }
    return {event: hooks for event, hooks in table.items() if hooks}


@dataclass(frozen=True, slots=True)
class HookRun:
    """How one hook run ended."""

    ok: bool
    blocked: bool = False
    message: str = ""


class TurnHooks:
    """The hooks of one turn, and the runs they make."""

    def __init__(
        self,
        table: HookTable,
        ctx: ToolContext,
        sink: ActivitySink,
        *,
        turn_id: str,
        session_id: str,
    ) -> None:
        self._table = table
        self._ctx = ctx
        self._sink = sink
        self._turn_id = turn_id
        self._session_id = session_id
        self._count = itertools.count(1)

    @classmethod
    def for_turn(
        cls,
        settings: Settings,
        ctx: ToolContext,
        sink: ActivitySink,
        *,
        turn_id: str,
        session_id: str,
    ) -> TurnHooks:
        """The hooks ``settings`` give a turn (:func:`active_hooks`)."""
        return cls(active_hooks(settings), ctx, sink, turn_id=turn_id, session_id=session_id)

    @property
    def has_tool_hooks(self) -> bool:
        return bool(self._table.get("pre_tool_use") or self._table.get("post_tool_use"))

    def wrap(self, tools: Iterable[Tool]) -> list[Tool]:
        """``tools`` with the tool hooks around each call (as they are when there are none)."""
        if not self.has_tool_hooks:
            return list(tools)
        return [HookedTool(tool, self) for tool in tools]

    async def user_prompt_submit(self, prompt: str) -> None:
        await self._run_all("user_prompt_submit", None, {"prompt": prompt})

    async def stop(self, final_text: str) -> None:
        await self._run_all("stop", None, {"final_text": final_text})

    async def pre_tool_use(self, tool_name: str, arguments: Mapping[str, object]) -> str | None:
        """The block message when a hook blocks the call, else ``None``."""
        event = {"tool_name": tool_name, "tool_arguments": dict(arguments)}
        for hook in self._matching("pre_tool_use", tool_name):
            run = await self._run("pre_tool_use", hook, event)
            if run.blocked:
                return f"{BLOCKED_PREFIX}: {run.message}" if run.message else f"{BLOCKED_PREFIX}."
        return None

    async def post_tool_use(
        self, tool_name: str, arguments: Mapping[str, object], outcome: ToolOutcome
    ) -> None:
        event = {
            "tool_name": tool_name,
            "tool_arguments": dict(arguments),
            "tool_output": outcome.output,
            "tool_is_error": outcome.is_error,
        }
        await self._run_all("post_tool_use", tool_name, event)

    def _matching(self, event: str, tool_name: str | None) -> list[HookDefinition]:
        hooks = self._table.get(event, ())
        if tool_name is None:
            return list(hooks)
        return [h for h in hooks if fnmatch.fnmatchcase(tool_name, h.matcher)]

    async def _run_all(self, event: str, tool_name: str | None, fields: dict[str, Any]) -> None:
        for hook in self._matching(event, tool_name):
            await self._run(event, hook, fields)

    async def _run(self, event: str, hook: HookDefinition, fields: dict[str, Any]) -> HookRun:
        hook_id = activity.identity("hook", self._turn_id, str(next(self._count)))
        self._sink.activity(activity.lifecycle(hook_id, "hook", "running"))
        try:
            run = await self._spawn(event, hook, fields)
        except asyncio.CancelledError:
            self._sink.activity(activity.lifecycle(hook_id, "activity", "cancelled"))
            raise
        self._sink.activity(
            activity.lifecycle(hook_id, "activity", "completed" if run.ok else "failed")
        )
        return run

    async def _spawn(self, event: str, hook: HookDefinition, fields: dict[str, Any]) -> HookRun:
        document = {
            "event": event,
            "session_id": self._session_id,
            "turn_id": self._turn_id,
            "project_dir": str(self._ctx.project_dir),
            **fields,
        }
        try:
            cwd = await asyncio.to_thread(project_root, self._ctx.project_dir)
            stdin = await asyncio.to_thread(_event_file, document)
        except (ToolInputError, OSError):
            log.info("a %s hook could not be started (project or temporary file)", event)
            return HookRun(ok=False)
        try:
            result = await run_shell(
                f"{_quoted(hook.command)} 2>/dev/null",
                cwd=cwd,
                env=child_environment(self._ctx.env, secret_names=self._ctx.secret_names),
                timeout=hook.timeout_ms / 1000,
                umask=self._ctx.umask,
                kind="hook",
                sandbox=self._ctx.sandbox,
                stdin=stdin,
                owner=self._ctx,
            )
        except (OSError, ValueError, ChildLimitReached):
            log.info("a %s hook could not be started", event)
            return HookRun(ok=False)
        finally:
            os.close(stdin)
        if result.timed_out:
            log.info(
                "a %s hook timed out after %d ms; its processes were killed", event, hook.timeout_ms
            )
            return HookRun(ok=False)
        if event == "pre_tool_use" and result.returncode == BLOCK_EXIT_CODE:
            message = bound_text(result.output.strip(), MAX_BLOCK_MESSAGE_BYTES)
            return HookRun(ok=True, blocked=True, message=message)
        if result.returncode != 0:
            log.info("a %s hook failed (exit status %s)", event, result.returncode)
            return HookRun(ok=False)
        return HookRun(ok=True)


def _quoted(words: Iterable[str]) -> str:
    """Each word single-quoted for ``/bin/sh``: never a reserved word, an assignment or an
    option, whatever it holds."""
    return " ".join("'" + word.replace("'", "'\"'\"'") + "'" for word in words)


def _event_file(document: Mapping[str, Any]) -> int:
    """The event's JSON in a new private (0600) temporary file, already unlinked: a file
    descriptor open for reading it from the start. Handed over open, a sandboxed hook
    reads it without seeing the host's temporary directory.

    ASCII JSON (``json.dumps``' escapes): tool arguments may hold integers beyond 64 bits
    and lone surrogates, which the model's JSON allowed.
    """
    data = json.dumps(document).encode("ascii")
    fd, path = tempfile.mkstemp(prefix="magi-code-hook-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


class HookedTool(WrappedTool):
    """A tool with the turn's ``pre_tool_use`` and ``post_tool_use`` hooks around each call."""

    def __init__(self, tool: Tool, hooks: TurnHooks) -> None:
        super().__init__(tool)
        self._hooks = hooks

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        message = await self._hooks.pre_tool_use(self.name, arguments)
        if message is not None:
            return ToolOutcome.error(message)
        outcome = await self._tool.run(arguments, ctx)
        await self._hooks.post_tool_use(self.name, arguments, outcome)
        return outcome
