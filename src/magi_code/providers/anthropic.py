"""Anthropic Messages API: request building and SSE decoding (providers.md §1).

Stream: ``message_start`` → per block ``content_block_start`` / ``_delta``* / ``_stop``
→ ``message_delta`` → ``message_stop`` (terminal); ``ping`` anywhere; ``error`` may
arrive after HTTP 200. Thinking is never surfaced as a reasoning summary (it is not a
provider-verified summary); thinking blocks come back as ``ContinuityItem`` so they can
be echoed unchanged, as the API requires when tools and thinking are combined.

Prompt caching: ``cache_control: {"type": "ephemeral"}`` breakpoints on the system
prompt, the last tool definition, the last message and the user message that ended the
previous request of the conversation (four at most, the API's limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import orjson

from magi_code.dataclass import dataclass, field
from magi_code.providers.errors import FailureLabel, ProviderFailure, stream_failure
from magi_code.providers.sse import SSEEvent
from magi_code.providers.types import (
    AssistantText,
    Completed,
    ContinuityItem,
    ConversationItem,
    Endpoint,
    ProviderRequest,
    StopReason,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    UsageEvent,
    UserText,
    complete_arguments,
)
from magi_code.providers.wire import (
    HttpCall,
    JsonObject,
    count,
    dumps,
    load_object,
    merged_headers,
    messages_value,
    obj,
    text,
)

API_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 8192
_MIN_THINKING_BUDGET: Final = 1024
# Thinking budgets per reasoning level; clamped so at least 1024 tokens stay for output.
THINKING_BUDGETS: Final[dict[str, int]] = {
    "low": 2048,
    "medium": 8192,
    "high": 16384,
    "x_high": 32000,
    "max": 64000,
}
_STOP_REASONS: Final[dict[str, StopReason]] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
}
_EPHEMERAL: Final[JsonObject] = {"type": "ephemeral"}
_THINKING: Final = ("thinking", "redacted_thinking")


def build_call(endpoint: Endpoint, request: ProviderRequest) -> HttpCall:
    max_tokens = request.max_output_tokens if request.max_output_tokens > 0 else DEFAULT_MAX_TOKENS
    body: JsonObject = {
        "model": request.model,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": messages_value(request, Messages, marks=_cache_breakpoints),
    }
    # Prompt caching: at most four breakpoints (the API's limit), see ``_breakpoint_messages``.
    if request.system:
        body["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
    if request.tools:
        tools: list[JsonObject] = [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in request.tools
        ]
        # The tool definitions come first in the cached prefix; they outlive a system
        # prompt that changes (a compaction summary rides in it).
        tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
        body["tools"] = tools
        body["tool_choice"] = {"type": "auto"}
    budget = THINKING_BUDGETS.get(request.reasoning)
    if budget is not None:
        budget = min(budget, max_tokens - _MIN_THINKING_BUDGET)
        if budget >= _MIN_THINKING_BUDGET:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    headers = merged_headers(endpoint.headers, anthropic_version=API_VERSION)
    return HttpCall(endpoint.url("/v1/messages"), headers, body)


class Messages:
    """Alternating user/assistant messages, item by item (``wire.Messages``).

    Consecutive same-role items share one message; tool results ride in the user message
    after the assistant's ``tool_use`` blocks; thinking blocks lead their assistant
    message, as the API requires. The last message is open: the next item of its role
    joins it.
    """

    def __init__(self) -> None:
        self.done: list[JsonObject] = []
        self._role = ""
        self._blocks: list[JsonObject] = []  # of the open message

    def add(self, item: ConversationItem) -> None:
        block: JsonObject | None
        if isinstance(item, UserText):
            role, block = "user", _text_block(item.text)
        elif isinstance(item, ToolResult):
            role = "user"
            block = {
                "type": "tool_result",
                "tool_use_id": item.call_id,
                "content": item.output,
                "is_error": item.is_error,
            }
        elif isinstance(item, AssistantText):
            role, block = "assistant", _text_block(item.text)
        elif isinstance(item, ToolCall):
            role = "assistant"
            block = {
                "type": "tool_use",
                "id": item.call_id,
                "name": item.name,
                "input": _arguments_object(item.arguments),
            }
        elif isinstance(item, ContinuityItem) and item.api == "anthropic":
            role, block = "assistant", _continuity_block(item.payload)
        else:
            return
        if block is None:
            return
        if role != self._role:
            self.done += self.rest()
            self._role, self._blocks = role, []
        self._blocks.append(block)

    def rest(self) -> list[JsonObject]:
        blocks = self._blocks
        if not blocks:
            return []
        if self._role == "assistant":
            blocks = sorted(blocks, key=lambda b: b.get("type") not in _THINKING)
        return [{"role": self._role, "content": list(blocks)}]


def _cache_breakpoints(messages: list[JsonObject]) -> dict[int, JsonObject]:
    return {index: _marked(messages[index]) for index in _breakpoint_messages(messages)}


def _breakpoint_messages(messages: Sequence[JsonObject]) -> list[int]:
    """Where the conversation's (at most two) cache breakpoints go.

    The last message: the whole request is the prefix the next request resends, so it is
    written to the cache. And the user message that ended the previous request (the one
    before the last assistant message): that prefix was written by the previous request,
    so this one reads it however many blocks the last answer and its tool results added
    (the API looks back only a bounded number of blocks from a breakpoint).
    """
    if not messages:
        return []
    marks = [len(messages) - 1]
    for index in range(len(messages) - 2, 0, -1):
        if messages[index]["role"] == "assistant":
            if messages[index - 1]["role"] == "user":
                marks.append(index - 1)
            break
    return marks


def _marked(message: JsonObject) -> JsonObject:
    """``message`` with a cache breakpoint: a copy, unless no block can carry one."""
    # Thinking blocks cannot carry cache_control; mark the newest block that can.
    content = message["content"]
    if not isinstance(content, list):
        return message
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if isinstance(block, dict) and block.get("type") in ("text", "tool_use", "tool_result"):
            marked = list(content)
            marked[i] = {**block, "cache_control": _EPHEMERAL}
            return {**message, "content": marked}
    return message


def _text_block(value: str) -> JsonObject | None:
    # The API rejects empty text blocks.
    return {"type": "text", "text": value} if value else None


def _arguments_object(arguments: str) -> JsonObject:
    # tool_use.input must be an object; invalid model JSON was already reported to the
    # model through the tool result, so an empty object keeps the history valid.
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _continuity_block(payload: str) -> JsonObject | None:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(slots=True)
class _Block:
    kind: str
    tool_id: str = ""
    tool_name: str = ""
    parts: list[str] = field(default_factory=list)
    signature: str = ""
    data: str = ""


class Decoder:
    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._input: int | None = None
        self._cache_read: int | None = None
        self._cache_write: int | None = None
        self._output: int | None = None
        self._stop: StopReason = "other"
        # Tool calls from the first one whose input is not a whole JSON object on: emitted
        # in order at ``message_stop``, once the stop reason says whether the output limit
        # cut that input (then it is dropped, see ``Completed``).
        self._held: list[ToolCall] = []
        self._started = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = load_object(event.data)
        kind = text(data.get("type")) or event.event
        if kind == "error":
            raise stream_failure(data)
        if kind == "message_start":
            self._started = True
            self._usage(obj(obj(data.get("message")).get("usage")))
        elif not self._started and kind != "ping":
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        elif kind == "content_block_start":
            return self._block_start(data)
        elif kind == "content_block_delta":
            return self._block_delta(data)
        elif kind == "content_block_stop":
            return self._block_stop(data)
        elif kind == "message_delta":
            reason = obj(data.get("delta")).get("stop_reason")
            if isinstance(reason, str):
                self._stop = _STOP_REASONS.get(reason, "other")
            self._usage(obj(data.get("usage")))
        elif kind == "message_stop":
            self._done = True
            cut = self._stop == "max_tokens"
            calls: list[StreamEvent] = [
                ToolCallEvent(ToolCall(call.call_id, call.name, call.arguments or "{}"))
                for call in self._held
                if not cut or complete_arguments(call.arguments)
            ]
            return [*calls, self._usage_event(), Completed(self._stop)]
        return []

    def finish(self) -> list[StreamEvent]:
        if not self._done:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        return []

    def _usage(self, usage: JsonObject) -> None:
        # message_delta usage is cumulative, so later values replace earlier ones.
        for key, attr in (
            ("input_tokens", "_input"),
            ("cache_read_input_tokens", "_cache_read"),
            ("cache_creation_input_tokens", "_cache_write"),
            ("output_tokens", "_output"),
        ):
            value = count(usage.get(key))
            if value is not None:
                setattr(self, attr, value)

    def _usage_event(self) -> UsageEvent:
        total = None
        if self._input is not None:
            total = self._input + (self._cache_read or 0) + (self._cache_write or 0)
        return UsageEvent(
            input_tokens=total,
            output_tokens=self._output,
            cache_read_tokens=self._cache_read,
            cache_known=self._cache_read is not None,
            reasoning_tokens=None,
        )

    def _block_start(self, data: JsonObject) -> list[StreamEvent]:
        index = _index(data)
        block = obj(data.get("content_block"))
        kind = text(block.get("type"))
        state = _Block(kind)
        self._blocks[index] = state
        if kind == "tool_use":
            state.tool_id = text(block.get("id"))
            state.tool_name = text(block.get("name"))
        elif kind == "thinking":
            state.parts.append(text(block.get("thinking")))
            state.signature = text(block.get("signature"))
        elif kind == "redacted_thinking":
            state.data = text(block.get("data"))
        elif kind == "text" and text(block.get("text")):
            return [TextDelta(text(block.get("text")))]
        return []

    def _block_delta(self, data: JsonObject) -> list[StreamEvent]:
        state = self._blocks.get(_index(data))
        if state is None:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        delta = obj(data.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            chunk = text(delta.get("text"))
            return [TextDelta(chunk)] if chunk else []
        if kind == "input_json_delta":
            state.parts.append(text(delta.get("partial_json")))
        elif kind == "thinking_delta":
            state.parts.append(text(delta.get("thinking")))
        elif kind == "signature_delta":
            state.signature = text(delta.get("signature"))
        return []

    def _block_stop(self, data: JsonObject) -> list[StreamEvent]:
        state = self._blocks.pop(_index(data), None)
        if state is None:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        if state.kind == "tool_use":
            arguments = "".join(state.parts)
            if self._held or not complete_arguments(arguments):
                self._held.append(ToolCall(state.tool_id, state.tool_name, arguments))
                return []
            return [ToolCallEvent(ToolCall(state.tool_id, state.tool_name, arguments))]
        if state.kind == "thinking" and state.signature:
            payload = {
                "type": "thinking",
                "thinking": "".join(state.parts),
                "signature": state.signature,
            }
            return [ContinuityItem("anthropic", dumps(payload))]
        if state.kind == "redacted_thinking" and state.data:
            payload = {"type": "redacted_thinking", "data": state.data}
            return [ContinuityItem("anthropic", dumps(payload))]
        return []


def _index(data: JsonObject) -> int:
    index = data.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ProviderFailure(FailureLabel.STREAM_ERROR)
    return index
