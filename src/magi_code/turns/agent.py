"""The agent loop behind a turn: stream from the provider, run tools, continue, compact.

Theory of operation: ``Agent.run`` sends the conversation (history + this prompt) to the
provider and streams assistant text to the sink. When the model asks for tools, each call
is persisted, executed, its result persisted, and the loop asks the model again, up to a
bounded number of provider requests. Everything the next turn and replay need goes
through ``sink.record`` (durable appends); activity goes through ``sink.activity``
(lossy, never blocking); assistant text goes through ``sink.text`` (reliable, bounded)
and, while it streams, is made durable in bounded increments (``turns.streamed``).

Cancellation is plain task cancellation: every await here is a cancellation point, the
provider stream is closed by leaving its ``async for``, and tools kill their children.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import httpx

from magi_code.providers.errors import ProviderFailure
from magi_code.providers.stream import stream_response
from magi_code.providers.types import (
    AssistantText,
    Completed,
    ContinuityItem,
    ConversationItem,
    Endpoint,
    ProviderRequest,
    ReasoningLevel,
    ReasoningSummary,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolSpec,
    UsageEvent,
    UserText,
)
from magi_code.tools.base import Tool, ToolContext, run_named_tool

from . import activity
from .context import estimate_tokens
from .streamed import StreamedText

MAX_PROVIDER_REQUESTS: Final = 24


class TurnSink(Protocol):
    async def text(self, delta: str) -> None:
        """Accept assistant text or raise ``OutputLimitExceeded``."""

    def activity(self, payload: dict[str, Any]) -> None:
        """Offer one activity; never blocks (a full queue drops it)."""

    async def record(self, record: Mapping[str, Any]) -> int:
        """Durably append one session record; returns its seq."""


class OutputLimitExceeded(Exception):
    """Assistant text would no longer fit the terminal event: the turn fails."""


class IterationLimitExceeded(Exception):
    """The model kept calling tools past the provider-request bound."""


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """Everything captured before the first provider request; a running turn keeps it."""

    endpoint: Endpoint
    model: str
    reasoning: ReasoningLevel
    fast: bool
    max_output_tokens: int
    context_window: int
    system: str
    cache_key: str


@dataclass(frozen=True, slots=True)
class AgentEnv:
    """What a turn's agents share: the main agent and every subagent of the turn."""

    client: httpx.AsyncClient
    plan: AgentPlan
    tool_ctx: ToolContext
    sink: TurnSink
    turn_id: str
    builtin_names: frozenset[str]


@dataclass(slots=True)
class UsageTotals:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_known: bool = True


class Agent:
    """One agent (main or subagent) over one conversation."""

    def __init__(
        self,
        env: AgentEnv,
        tools: Sequence[Tool],
        *,
        persist: bool = True,
        stream_text: bool = True,
        parent_activity_id: str | None = None,
        reauthorize: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
    ) -> None:
        self.client = env.client
        self.plan = env.plan
        self.tools = {tool.name: tool for tool in tools}
        self.specs = [ToolSpec(t.name, t.description, t.parameters) for t in tools]
        self.tool_ctx = env.tool_ctx
        self.sink = env.sink
        self.turn_id = env.turn_id
        self.builtin_names = env.builtin_names
        self.persist = persist
        self.stream_text = stream_text
        self.parent_activity_id = parent_activity_id
        # Codex only: fresh credentials after a 401 (the token was revoked or rotated).
        self.reauthorize = reauthorize
        self.request_sequence = 0
        self.usage = UsageTotals()
        # Text of the provider response in flight; the turn settles it when it ends.
        self.streamed = StreamedText(None)
        self.final_text = ""

    async def run(self, history: Sequence[ConversationItem], prompt: str) -> str:
        """Run to completion; returns the last assistant message text."""
        items: list[ConversationItem] = [*history, UserText(prompt)]
        for _ in range(MAX_PROVIDER_REQUESTS):
            calls = await self._request(items)
            if not calls:
                return self.final_text
            for call in calls:
                items.append(await self._run_tool(call))
        raise IterationLimitExceeded

    async def _request(self, items: list[ConversationItem]) -> list[ToolCall]:
        self.request_sequence += 1
        context_id = activity.identity("context", self.turn_id, self.parent_activity_id or "")
        self.sink.activity(
            activity.context(
                context_id,
                current_tokens=estimate_tokens(self.plan.system, items),
                max_tokens=self.plan.context_window,
                reasoning_tokens=None,
                request_sequence=self.request_sequence,
                source="fallback_estimate",
            )
        )
        request = ProviderRequest(
            model=self.plan.model,
            system=self.plan.system,
            items=list(items),
            tools=self.specs,
            reasoning=self.plan.reasoning,
            fast=self.plan.fast,
            max_output_tokens=self.plan.max_output_tokens,
            cache_key=self.plan.cache_key,
        )
        continuity: list[ContinuityItem] = []
        calls: list[ToolCall] = []
        usage: UsageEvent | None = None
        self.streamed = StreamedText(
            self._append_text if self.persist else None, incremental=self.stream_text
        )
        async with contextlib.aclosing(self._events(request)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    if self.stream_text:
                        await self.sink.text(event.text)
                    self.streamed.add(event.text)
                elif isinstance(event, ToolCallEvent):
                    calls.append(event.call)
                elif isinstance(event, ReasoningSummary):
                    summary_id = activity.identity(
                        "reasoning", self.turn_id, str(self.request_sequence)
                    )
                    self.sink.activity(activity.reasoning_summary(summary_id, event.text))
                elif isinstance(event, UsageEvent):
                    usage = event
                elif isinstance(event, ContinuityItem):
                    continuity.append(event)
                elif isinstance(event, Completed):
                    break
        await self.streamed.settle()
        text = self.streamed.text
        self.final_text = text
        items.extend(continuity)
        if text:
            items.append(AssistantText(text))
        items.extend(calls)
        if usage is not None:
            self._report_usage(usage, context_id, final=not calls)
        return calls

    async def _events(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]:
        """The provider stream; a 401 before any event re-authorizes once and retries."""
        started = False
        try:
            async with contextlib.aclosing(
                stream_response(self.client, self.plan.endpoint, request)
            ) as stream:
                async for event in stream:
                    started = True
                    yield event
            return
        except ProviderFailure as exc:
            if started or exc.status != 401 or self.reauthorize is None:
                raise
        headers = await self.reauthorize()
        self.reauthorize = None
        endpoint = dataclasses.replace(self.plan.endpoint, headers=headers)
        self.plan = dataclasses.replace(self.plan, endpoint=endpoint)
        async with contextlib.aclosing(
            stream_response(self.client, self.plan.endpoint, request)
        ) as stream:
            async for event in stream:
                yield event

    def _report_usage(self, usage: UsageEvent, context_id: str, *, final: bool) -> None:
        effective = usage.input_tokens or 0
        output = usage.output_tokens or 0
        cache_read = usage.cache_read_tokens or 0
        self.usage.input_tokens += effective
        self.usage.output_tokens += output
        self.usage.cache_read_tokens += cache_read
        self.usage.cache_known &= usage.cache_known
        usage_id = activity.identity("usage", self.turn_id, self.parent_activity_id or "")
        self.sink.activity(
            activity.usage(
                usage_id,
                effective_input=effective,
                output=output,
                cache_read=cache_read,
                cache_known=usage.cache_known,
                request_sequence=self.request_sequence,
                final_usage=final,
                source="provider_request",
            )
        )
        if usage.input_tokens is not None:
            self.sink.activity(
                activity.context(
                    context_id,
                    current_tokens=effective + output,
                    max_tokens=self.plan.context_window,
                    reasoning_tokens=usage.reasoning_tokens,
                    request_sequence=self.request_sequence,
                    source="provider_exact",
                )
            )

    async def _run_tool(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        server_name = getattr(tool, "server_name", None)
        tool_name = getattr(tool, "tool_name", call.name)
        activity_id = activity.identity("tool-call", self.turn_id, call.call_id)
        await self._record(
            {
                "type": "tool_call",
                "turn_id": self.turn_id,
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        self._tool_activity(activity_id, tool_name, server_name, "running", None)
        outcome = await run_named_tool(self.tools, call.name, call.arguments, self.tool_ctx)
        status: activity.LifecycleStatus = "failed" if outcome.is_error else "completed"
        self._tool_activity(activity_id, tool_name, server_name, status, outcome.timed_out)
        await self._record(
            {
                "type": "tool_result",
                "turn_id": self.turn_id,
                "call_id": call.call_id,
                "name": call.name,
                "output": outcome.output,
                "is_error": outcome.is_error,
            }
        )
        return ToolResult(call.call_id, call.name, outcome.output, outcome.is_error)

    def _tool_activity(
        self,
        activity_id: str,
        tool_name: str,
        server_name: str | None,
        status: activity.LifecycleStatus,
        timed_out: bool | None,
    ) -> None:
        if self.parent_activity_id is not None:
            # Child work is linked to its subagent task through lifecycle parentage.
            if status == "running":
                self.sink.activity(
                    activity.lifecycle(activity_id, "tool", status, self.parent_activity_id)
                )
            else:
                self.sink.activity(activity.lifecycle(activity_id, "activity", status))
            return
        self.sink.activity(
            activity.tool(
                activity_id,
                tool_name=tool_name,
                builtin_names=self.builtin_names,
                server_name=server_name,
                status=status,
                timed_out=timed_out,
            )
        )

    async def settle_text(self) -> None:
        """Make the text streamed so far durable (the turn's end, after a cancel or failure)."""
        await self.streamed.settle()

    async def _append_text(self, text: str, continued: bool) -> None:
        record: dict[str, Any] = {"type": "assistant", "turn_id": self.turn_id, "text": text}
        if continued:
            record["continued"] = True
        await self.sink.record(record)

    async def _record(self, record: Mapping[str, Any]) -> None:
        if self.persist:
            await self.sink.record(record)
