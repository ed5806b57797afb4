"""The agent loop behind a turn: stream from the provider, run tools, continue, compact.

Theory of operation: ``Agent.run`` sends the conversation (history + this prompt) to the
provider and streams assistant text to the sink. When the model asks for tools, each call
is persisted, executed, its result persisted, and the loop asks the model again, up to a
bounded number of provider requests. Consecutive calls of read-only tools (``read_only``)
run at the same time, at most ``MAX_CONCURRENT_READS`` at once: their calls are recorded
first, in order, each result as it finishes; the model gets the results in call order.
Everything the next turn and replay need goes through ``sink.record`` (durable appends);
activity goes through ``sink.activity`` (lossy, never blocking); assistant text goes
through ``sink.text`` (reliable, bounded) and, while it streams, is made durable in
bounded increments (``turns.streamed``).

Continuation: a response the provider's output-token limit ended (``max_tokens``) is
continued automatically, at most ``MAX_CONTINUATIONS`` times in a row: the partial text
goes back as the assistant's message followed by ``CONTINUE_PROMPT``. The streamed text
stays one reply (one message in the records, joined for the provider next turn). A tool
call the limit cut is never emitted by the provider layer, so never run. When the bound
is reached the turn ends with the text it has and the reply's last record says
``truncated``.

Compaction (``turns.context`` has the thresholds): before a request whose estimate
reaches the threshold, and once after a ``context_length_exceeded`` failure (then the
request is retried once), the conversation so far is replaced by a provider-written
summary; the main agent persists it as a checkpoint and reports ``compaction`` activity.
At the start of a turn whose history begins before the readable window, compaction is
required: when it cannot be done the turn ends ``compaction_required``.

Usage: the main agent reports each of its provider requests (summary requests included)
as ``usage`` with ``source: "provider_request"``; ``final_usage`` marks only the request
whose reply is the turn's answer. A subagent reports none: its requests appear only in the
one ``subagent_aggregate`` of its task (``turns.subagent``), so the turn's top-level
``provider_request`` usage plus its aggregates count every request once.

Steering: the main agent may be given ``steers``, which hands over (and makes durable)
the text the controller sent into the running turn. It is asked at each request
boundary — after a response's tool calls all finished, before the next request — and
what it returns joins the conversation as user messages; the turn goes on.

Cancellation is plain task cancellation: every await here is a cancellation point, the
provider stream is closed by leaving its ``async for``, and tools kill their children.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, Protocol

from magi_code.dataclass import dataclass, field
from magi_code.providers.errors import FailureLabel, ProviderFailure
from magi_code.providers.stream import DEFAULT_SETTINGS, StreamSettings, stream_response
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
from magi_code.providers.wire import MessageCache
from magi_code.sessions.store import SessionContext
from magi_code.tools.base import Tool, ToolContext, run_named_tool
from magi_code.tools.frontend import call_detail

from . import activity
from .context import (
    RESUME_PROMPT,
    GrowingEstimate,
    estimate_tokens,
    leading_user,
    needs_compaction,
    summarize,
    system_with_summary,
)
from .streamed import StreamedText

if TYPE_CHECKING:
    import httpx

# The main agent's own model requests per turn (continuations included; compaction
# summaries not).
MAX_PROVIDER_REQUESTS: Final = 64
# Automatic continuations of one reply cut by the output-token limit, in a row.
MAX_CONTINUATIONS: Final = 3
CONTINUE_PROMPT: Final = (
    "Your reply was cut off by the output token limit. Continue exactly where it stopped, "
    "without repeating anything; send again any tool call that was cut off."
)
# Consecutive calls of this tool in one reply run concurrently, as one subagent batch.
TASK_TOOL_NAME: Final = "task"
# Consecutive calls of read-only tools in one reply run concurrently, this many at a time.
MAX_CONCURRENT_READS: Final = 8

# The activity ID of the tool call being executed (the ``task`` tool links its subagent
# to it); set around each execution, so concurrent calls each see their own.
TOOL_CALL_ACTIVITY: ContextVar[str | None] = ContextVar("tool_call_activity", default=None)


class TurnSink(Protocol):
    async def text(self, delta: str) -> None:
        """Accept assistant text or raise ``OutputLimitExceeded``."""

    def activity(self, payload: dict[str, Any]) -> None:
        """Offer one activity; never blocks (a full queue drops it)."""

    async def record(self, record: Mapping[str, Any]) -> int:
        """Append one session record (group-committed); returns its seq. Events sent after
        it are released only once it is durable."""


class OutputLimitExceeded(Exception):
    """Assistant text would no longer fit the terminal event: the turn fails."""


class IterationLimitExceeded(Exception):
    """The model kept calling tools past the provider-request bound."""


class CompactionRequired(ProviderFailure):
    """The conversation must be compacted before the next request and could not be.

    The turn ends with the session terminal status ``compaction_required``; on the v1
    wire it is ``failed`` with the label ``context_length_exceeded``.
    """

    def __init__(self) -> None:
        super().__init__(FailureLabel.CONTEXT_LENGTH_EXCEEDED)


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """Everything captured before the first provider request; a running turn keeps it.

    ``system`` is the system prompt without any summary (each agent adds its own)."""

    endpoint: Endpoint
    model: str
    reasoning: ReasoningLevel
    fast: bool
    max_output_tokens: int
    context_window: int
    system: str
    cache_key: str
    stream: StreamSettings = DEFAULT_SETTINGS  # timeouts and retries of its requests


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

    def add(self, usage: UsageEvent) -> None:
        self.input_tokens += usage.input_tokens or 0
        self.output_tokens += usage.output_tokens or 0
        self.cache_read_tokens += usage.cache_read_tokens or 0
        self.cache_known &= usage.cache_known


@dataclass(slots=True)
class ProviderReply:
    """What one provider response asked for."""

    calls: list[ToolCall]
    cut: bool  # the output-token limit ended it
    usage: UsageEvent | None
    context_id: str


@dataclass(slots=True)
class _Context:
    """Where the conversation the agent sends starts, for the next compaction."""

    summary: str | None = None
    history_len: int = 0  # items before this turn's prompt (only until anything is added)
    history_seq: int | None = None  # the last record those items come from
    grown: bool = False  # items were added since the start or the last compaction
    measured: tuple[int, int] | None = None  # (items then, tokens) of the last usage
    failure: BaseException | None = field(default=None)  # why the last compaction failed


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
        steers: Callable[[], Awaitable[Sequence[str]]] | None = None,
    ) -> None:
        self.client = env.client
        self.plan = env.plan
        self.tools = {tool.name: tool for tool in tools}
        self.specs = [ToolSpec(t.name, t.description, t.parameters) for t in tools]
        # A subagent's calls are not the frontend's tool calls: no details of them.
        self.tool_ctx = (
            env.tool_ctx
            if parent_activity_id is None or env.tool_ctx.details is None
            else dataclasses.replace(env.tool_ctx, details=None)
        )
        self.sink = env.sink
        self.turn_id = env.turn_id
        self.builtin_names = env.builtin_names
        self.persist = persist
        self.stream_text = stream_text
        self.parent_activity_id = parent_activity_id
        # Codex only: fresh credentials after a 401 (the token was revoked or rotated).
        self.reauthorize = reauthorize
        # The main agent only: steer texts that arrived since the last request boundary.
        self.steers = steers
        self.request_sequence = 0
        self.usage = UsageTotals()
        self.system = self.plan.system
        self.compactions = 0
        # Text of the reply in flight (one response, or several when it is continued);
        # the turn settles it when it ends.
        self.streamed = StreamedText(None)
        self.final_text = ""
        self.output_truncated = False
        self._context = _Context()
        self._fallback = GrowingEstimate()
        # The conversation's messages as the provider's API wants them, encoded once.
        self._messages = MessageCache()
        self._continuing = False  # the next response continues ``streamed``
        self._accepted_text = False  # the response in flight streamed text
        self._last_seq: int | None = None  # the last record this agent appended
        self._truncation_recorded = False

    async def run(
        self,
        history: Sequence[ConversationItem],
        prompt: str,
        *,
        session: SessionContext | None = None,
    ) -> str:
        """Run to completion; returns the text of the last reply (the turn's answer).

        ``session`` is what the history was rebuilt from (its summary, where it ends, and
        whether it starts before the readable window); the main agent gets it.

        Raises:
            CompactionRequired: the history starts before the readable window, or the
                provider found it too long, and it could not be compacted.
        """
        items: list[ConversationItem] = [*history, UserText(prompt)]
        if session is not None:
            self._context.summary = session.summary
            self._context.history_len = len(history)
            self._context.history_seq = max((r.seq for r in session.records), default=None)
            self.system = system_with_summary(self.plan.system, session.summary)
            if session.history_cut:
                await self._compact_or_fail(items)
        try:
            await self._loop(items)
        finally:
            # The encoded conversation is as large as the conversation: not kept past the
            # run, whatever still holds the agent (an agent can sit in a reference cycle).
            self._messages.clear()
        return self.final_text

    async def _loop(self, items: list[ConversationItem]) -> None:
        continued = 0
        for _ in range(MAX_PROVIDER_REQUESTS):
            response = await self._request(items)
            bound = response.cut and continued == MAX_CONTINUATIONS
            self._report_usage(response, final=bound or not (response.cut or response.calls))
            if bound:
                await self._record_truncation()
                break
            await self._run_tools(items, response.calls)
            if response.cut:
                continued += 1
                items.append(UserText(CONTINUE_PROMPT))
            elif not response.calls:
                break
            else:
                continued = 0
                if self.steers is not None:
                    # Recorded by ``steers`` itself, where they entered (before the request).
                    items.extend(UserText(text) for text in await self.steers())
        else:
            raise IterationLimitExceeded

    # -- provider requests ---------------------------------------------------------------

    async def _request(self, items: list[ConversationItem]) -> ProviderReply:
        """One response, after compacting when the request would reach the threshold; a
        ``context_length_exceeded`` failure is answered by compaction and one retry."""
        estimate, _ = self._estimate(items)
        # After a failed attempt only a context-length error tries again (each attempt
        # costs a provider request).
        if (
            needs_compaction(estimate, self.plan.context_window)
            and self._compactable()
            and self._context.failure is None
        ):
            await self._compact(items)  # a failure leaves the conversation as it was
        try:
            return await self._stream(items)
        except ProviderFailure as exc:
            if exc.label is not FailureLabel.CONTEXT_LENGTH_EXCEEDED or self._accepted_text:
                raise
            if not self._compactable():
                raise  # nothing to compact: the prompt alone does not fit
        await self._compact_or_fail(items)
        return await self._stream(items)

    async def _stream(self, items: list[ConversationItem]) -> ProviderReply:
        self.request_sequence += 1
        context_id = activity.identity("context", self.turn_id, self.parent_activity_id or "")
        estimate, source = self._estimate(items)
        self.sink.activity(
            activity.context(
                context_id,
                current_tokens=estimate,
                max_tokens=self.plan.context_window,
                reasoning_tokens=None,
                request_sequence=self.request_sequence,
                source=source,
            )
        )
        request = ProviderRequest(
            model=self.plan.model,
            system=self.system,
            items=leading_user(items),
            tools=self.specs,
            reasoning=self.plan.reasoning,
            fast=self.plan.fast,
            max_output_tokens=self.plan.max_output_tokens,
            cache_key=self.plan.cache_key,
            message_cache=self._messages,
        )
        continuity: list[ContinuityItem] = []
        calls: list[ToolCall] = []
        usage: UsageEvent | None = None
        stop = "other"
        if not self._continuing:
            self.streamed = StreamedText(
                self._append_text if self.persist else None, incremental=self.stream_text
            )
        start = len(self.streamed.text)
        self._accepted_text = False
        async with contextlib.aclosing(self._events(request)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    self._accepted_text = True
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
                    stop = event.stop_reason
                    break
        cut = stop == "max_tokens"
        # A reply cut mid-text goes on in the next response as the same message; one
        # that asked for tools ends here (its calls come between it and what follows).
        self._continuing = cut and not calls
        if not self._continuing:
            await self.streamed.settle()
        text = self.streamed.text
        self.final_text = text
        items.extend(continuity)
        if len(text) > start:
            items.append(AssistantText(text[start:]))
        items.extend(calls)
        self._context.grown = True
        if usage is not None and usage.input_tokens is not None:
            self._context.measured = (len(items), usage.input_tokens + (usage.output_tokens or 0))
        return ProviderReply(calls, cut, usage, context_id)

    async def _events(self, request: ProviderRequest) -> AsyncGenerator[StreamEvent, None]:
        """The provider stream; a 401 before any event re-authorizes once and retries."""
        started = False
        try:
            async with contextlib.aclosing(
                stream_response(self.client, self.plan.endpoint, request, self.plan.stream)
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
            stream_response(self.client, self.plan.endpoint, request, self.plan.stream)
        ) as stream:
            async for event in stream:
                yield event

    def _estimate(self, items: Sequence[ConversationItem]) -> tuple[int, activity.ContextSource]:
        """Tokens the next request would take: the last usage plus what came since, or
        the fallback estimate of everything before any usage (and after a compaction)."""
        measured = self._context.measured
        if measured is not None:
            count, tokens = measured
            return tokens + estimate_tokens("", items[count:]), "fallback_projection"
        return self._fallback.tokens(self.system, items), "fallback_estimate"

    # -- usage ---------------------------------------------------------------------------

    def _report_usage(self, response: ProviderReply, *, final: bool) -> None:
        usage = response.usage
        if usage is None:
            return
        self._count_usage(usage, final=final)
        if usage.input_tokens is not None:
            self.sink.activity(
                activity.context(
                    response.context_id,
                    current_tokens=usage.input_tokens + (usage.output_tokens or 0),
                    max_tokens=self.plan.context_window,
                    reasoning_tokens=usage.reasoning_tokens,
                    request_sequence=self.request_sequence,
                    source="provider_exact",
                )
            )

    def _count_usage(self, usage: UsageEvent, *, final: bool) -> None:
        """Add one request's usage to the totals; the main agent also reports it."""
        self.usage.add(usage)
        if self.parent_activity_id is not None:
            return  # a subagent's usage is only in its task's aggregate
        self.sink.activity(
            activity.usage(
                activity.identity("usage", self.turn_id, str(self.request_sequence)),
                effective_input=usage.input_tokens or 0,
                output=usage.output_tokens or 0,
                cache_read=usage.cache_read_tokens or 0,
                cache_known=usage.cache_known,
                request_sequence=self.request_sequence,
                final_usage=final,
                source="provider_request",
            )
        )

    # -- compaction ----------------------------------------------------------------------

    def _compactable(self) -> bool:
        """Whether there is conversation a summary could replace (and, for the main
        agent, a record for the checkpoint to start after)."""
        context = self._context
        if context.grown:
            return not self.persist or self._last_seq is not None or context.history_seq is not None
        return context.history_len > 0 and (not self.persist or context.history_seq is not None)

    async def _compact_or_fail(self, items: list[ConversationItem]) -> None:
        """Compaction the next request cannot do without.

        Raises:
            ProviderFailure: the summary request failed for another reason than the
                length of what it carried (rate limits, authentication, ...).
            CompactionRequired: there was nothing to compact, or it did not succeed.
        """
        if self._compactable() and await self._compact(items):
            return
        failure = self._context.failure
        if (
            isinstance(failure, ProviderFailure)
            and failure.label is not FailureLabel.CONTEXT_LENGTH_EXCEEDED
        ):
            raise failure
        raise CompactionRequired

    async def _compact(self, items: list[ConversationItem]) -> bool:
        """Replace the conversation so far with a provider-written summary.

        Before anything was added in this turn it covers the history only (the prompt
        stays, the checkpoint ends before this turn's records); later it covers
        everything (the checkpoint ends with this agent's last record, and
        ``RESUME_PROMPT`` takes the conversation's place). False when it failed: the
        conversation is then as it was.
        """
        await self.streamed.settle()  # a reply being continued ends here
        self._continuing = False
        context = self._context
        if context.grown:
            covered: list[ConversationItem] = list(items)
            kept: list[ConversationItem] = [UserText(RESUME_PROMPT)]
            cutoff = self._last_seq if self._last_seq is not None else context.history_seq
        else:
            covered = items[: context.history_len]
            kept = items[context.history_len :]
            cutoff = context.history_seq
        self.compactions += 1
        compaction_id = activity.identity(
            "compaction", self.turn_id, self.parent_activity_id or "", str(self.compactions)
        )
        before, _ = self._estimate(items)
        window = self.plan.context_window
        self._compaction_activity(activity.compaction(compaction_id, "triggered", before, window))
        self._compaction_activity(activity.compaction(compaction_id, "running"))
        try:
            self.request_sequence += 1
            text, usage = await summarize(
                self.client,
                self.plan.endpoint,
                self.plan.model,
                covered,
                context.summary,
                context_window=window,
                max_output_tokens=self.plan.max_output_tokens,
                settings=self.plan.stream,
            )
            if usage is not None:
                self._count_usage(usage, final=False)
            if not text.strip():
                raise ValueError("empty summary")
            if self.persist:
                assert cutoff is not None  # _compactable()
                await self.sink.record(
                    {"type": "compaction", "summary": text, "cutoff_seq": cutoff}
                )
        except asyncio.CancelledError:
            self._compaction_activity(activity.compaction(compaction_id, "cancelled"))
            raise
        except Exception as exc:  # noqa: BLE001 - a failed compaction changes nothing
            context.failure = exc
            self._compaction_activity(activity.compaction(compaction_id, "failed"))
            return False
        context.failure = None
        context.summary = text
        context.history_len = 0
        context.grown = False
        context.measured = None
        self.system = system_with_summary(self.plan.system, text)
        items[:] = kept
        after = self._fallback.tokens(self.system, items)
        self._compaction_activity(activity.compaction(compaction_id, "completed", after, window))
        return True

    def _compaction_activity(self, payload: dict[str, Any]) -> None:
        # A subagent's compaction changes nothing a client could replay: not reported.
        if self.persist:
            self.sink.activity(payload)

    # -- tools ---------------------------------------------------------------------------

    async def _run_tools(self, items: list[ConversationItem], calls: Sequence[ToolCall]) -> None:
        """Run the calls in order, except that consecutive ``task`` calls run concurrently,
        as one ``subagent_batch``, and so do consecutive calls of read-only tools. Results
        join ``items`` in the order of the calls."""
        index = 0
        while index < len(calls):
            kind = self._concurrency(calls[index])
            end = index + 1
            while end < len(calls) and kind is not None and self._concurrency(calls[end]) == kind:
                end += 1
            if end - index == 1:
                items.append(await self._run_tool(calls[index]))
            elif kind == TASK_TOOL_NAME:
                items.extend(await self._run_batch(calls[index:end]))
            else:
                items.extend(await self._run_reads(calls[index:end]))
            index = end

    def _concurrency(self, call: ToolCall) -> str | None:
        """Which calls this one may run beside: ``task`` calls, read-only calls, or none."""
        if call.name == TASK_TOOL_NAME:
            return TASK_TOOL_NAME
        tool = self.tools.get(call.name)
        return "read" if getattr(tool, "read_only", False) is True else None

    async def _run_batch(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        batch_id = activity.identity("subagent-batch", self.turn_id, calls[0].call_id)
        self.sink.activity(activity.lifecycle(batch_id, "subagent_batch", "running"))
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._run_tool(call, batch_id)) for call in calls]
        except asyncio.CancelledError:
            self.sink.activity(activity.lifecycle(batch_id, "activity", "cancelled"))
            raise
        except BaseExceptionGroup as failed:
            self.sink.activity(activity.lifecycle(batch_id, "activity", "failed"))
            raise failed.exceptions[0] from None
        self.sink.activity(activity.lifecycle(batch_id, "activity", "completed"))
        return [task.result() for task in tasks]

    async def _run_reads(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Read-only calls at the same time: every ``tool_call`` record first, in order;
        each result is recorded as its call finishes."""
        activity_ids = [await self._record_call(call) for call in calls]
        limit = asyncio.Semaphore(MAX_CONCURRENT_READS)

        async def one(call: ToolCall, activity_id: str) -> ToolResult:
            async with limit:
                return await self._execute(call, activity_id)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(one(*pair)) for pair in zip(calls, activity_ids, strict=True)
                ]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _run_tool(self, call: ToolCall, batch_id: str | None = None) -> ToolResult:
        return await self._execute(call, await self._record_call(call), batch_id)

    async def _record_call(self, call: ToolCall) -> str:
        """Persist a call before it runs; returns its activity ID."""
        await self._record(
            {
                "type": "tool_call",
                "turn_id": self.turn_id,
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        if self.parent_activity_id is None:
            return activity.identity("tool-call", self.turn_id, call.call_id)
        # Call IDs of different subagents may repeat.
        return activity.identity("tool-call", self.turn_id, self.parent_activity_id, call.call_id)

    async def _execute(
        self, call: ToolCall, activity_id: str, batch_id: str | None = None
    ) -> ToolResult:
        """The one place a tool call is executed (its call recorded before, its result after)."""
        tool = self.tools.get(call.name)
        server_name = getattr(tool, "server_name", None)
        tool_name = getattr(tool, "tool_name", call.name)
        token = TOOL_CALL_ACTIVITY.set(activity_id)
        try:
            details = self.tool_ctx.details
            if details is not None:  # before the activity, so a frontend has both at once
                detail = await asyncio.to_thread(
                    call_detail, call.name, call.arguments, self.tool_ctx.project_dir
                )
                if detail is not None:
                    details({"call": detail})
            self._tool_activity(activity_id, tool_name, server_name, "running", None, batch_id)
            outcome = await run_named_tool(self.tools, call.name, call.arguments, self.tool_ctx)
        finally:
            TOOL_CALL_ACTIVITY.reset(token)
        status: activity.LifecycleStatus = "failed" if outcome.is_error else "completed"
        self._tool_activity(
            activity_id, tool_name, server_name, status, outcome.timed_out, batch_id
        )
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
        batch_id: str | None = None,
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
                parent_activity_id=batch_id,
            )
        )

    # -- records -------------------------------------------------------------------------

    async def settle_text(self) -> None:
        """Make the text streamed so far durable (the turn's end, after a cancel or failure)."""
        await self.streamed.settle()

    async def _record_truncation(self) -> None:
        """The continuation bound was reached: the reply ends as it is, marked ``truncated``
        on its last record (an empty one when its text is already durable)."""
        self.output_truncated = True
        await self.streamed.settle()
        if self.persist and not self._truncation_recorded:
            await self._append_text("", False)

    async def _append_text(self, text: str, continued: bool) -> None:
        record: dict[str, Any] = {"type": "assistant", "turn_id": self.turn_id, "text": text}
        if continued:
            record["continued"] = True
        elif self.output_truncated and not self._truncation_recorded:
            record["truncated"] = True
            self._truncation_recorded = True
        self._last_seq = await self.sink.record(record)

    async def _record(self, record: Mapping[str, Any]) -> None:
        if self.persist:
            self._last_seq = await self.sink.record(record)
