"""The ``task`` tool: a subagent with its own context and tools, linked by activity.

The child runs inside the parent's turn (so it is cancelled with it) and shares the
parent's sequence and activity queue. Its text is not streamed to the frontend and its
records are not persisted: only its final answer returns to the parent model as the tool
result. Its work appears as a ``subagent_task`` lifecycle whose ``parent_activity_id`` is
the ``task`` tool call's activity, child lifecycles linked to the task through
``parent_activity_id``, and one ``subagent_aggregate`` usage for the whole run: the only
report of the child's tokens (its requests have no ``usage`` of their own), with
``final_usage: false``. Consecutive ``task`` calls of one reply run concurrently as one
``subagent_batch`` (``turns.agent``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from magi_code.tools.base import Tool, ToolContext, ToolOutcome

from . import activity
from .agent import TASK_TOOL_NAME, TOOL_CALL_ACTIVITY, Agent, AgentEnv

__all__ = ["TASK_TOOL_NAME", "TaskTool"]


class TaskTool:
    name = TASK_TOOL_NAME
    description = (
        "Delegate a self-contained task to a subagent with a fresh context and the file and "
        "shell tools. It returns the subagent's final answer."
    )
    parameters: Mapping[str, object] = {
        "type": "object",
        "properties": {
            "description": {"type": "string", "description": "A short name for the task."},
            "prompt": {"type": "string", "description": "Everything the subagent needs."},
        },
        "required": ["prompt"],
    }

    def __init__(self, env: AgentEnv, tools: Sequence[Tool]) -> None:
        self._env = env
        self._tools = tools
        self._count = itertools.count(1)

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        prompt = arguments.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return ToolOutcome.error("The task tool needs a non-empty 'prompt' string.")
        sink = self._env.sink
        call_activity = TOOL_CALL_ACTIVITY.get()
        task_id = activity.identity(
            "subagent", self._env.turn_id, call_activity or str(next(self._count))
        )
        sink.activity(activity.lifecycle(task_id, "subagent_task", "running", call_activity))
        child = Agent(
            self._env, self._tools, persist=False, stream_text=False, parent_activity_id=task_id
        )
        status: Any = "completed"
        try:
            answer = await child.run([], prompt)
        except asyncio.CancelledError:
            sink.activity(activity.lifecycle(task_id, "activity", "cancelled"))
            raise
        except Exception:  # noqa: BLE001 - the child's failure is the tool's failure, not the turn's
            status = "failed"
            answer = ""
        sink.activity(activity.lifecycle(task_id, "activity", status))
        sink.activity(
            activity.usage(
                activity.identity("subagent-usage", task_id),
                effective_input=child.usage.input_tokens,
                output=child.usage.output_tokens,
                cache_read=child.usage.cache_read_tokens,
                cache_known=child.usage.cache_known,
                request_sequence=child.request_sequence,
                final_usage=False,
                source="subagent_aggregate",
            )
        )
        if status == "failed":
            return ToolOutcome.error("The subagent could not finish the task.")
        return ToolOutcome(answer or "(The subagent returned no text.)")
