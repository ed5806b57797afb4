"""OpenAI Responses API (Codex / ChatGPT backend): request building and SSE decoding.

providers.md §2.6. The body always has ``store:false``, top-level ``instructions`` and
``stream:true`` (the ChatGPT backend rejects anything else) and never
``max_output_tokens``; ``prompt_cache_key`` is derived from the session ID (requests of
one session share it, so they reach the same prompt cache). Stream:
``response.output_text.delta`` for text, ``response.output_item.done`` for complete
items (function calls, reasoning items, messages),
``response.reasoning_summary_text.done`` for verified summaries, and
``response.completed`` as the terminal event; ``response.failed``, a top-level
``error`` event and ``response.incomplete`` (other than for the output cap) fail.
"""

from __future__ import annotations

import hashlib

from magi_code.providers.errors import FailureLabel, ProviderFailure, stream_failure
from magi_code.providers.sse import SSEEvent
from magi_code.providers.types import (
    AssistantText,
    Completed,
    ContinuityItem,
    ConversationItem,
    Endpoint,
    ProviderRequest,
    ReasoningSummary,
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
    REASONING_EFFORT,
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


def build_call(endpoint: Endpoint, request: ProviderRequest) -> HttpCall:
    body: JsonObject = {
        "model": request.model,
        "instructions": request.system,
        "input": messages_value(request, Input),
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "strict": False,
                "parameters": dict(t.parameters),
            }
            for t in request.tools
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "store": False,
        "stream": True,
    }
    effort = REASONING_EFFORT.get(request.reasoning)
    if effort is not None:
        body["reasoning"] = {"effort": effort, "summary": "auto"}
        # With store:false, reasoning only carries over as encrypted content we echo back.
        body["include"] = ["reasoning.encrypted_content"]
    if request.fast:
        body["service_tier"] = "priority"
    if request.cache_key:
        body["prompt_cache_key"] = prompt_cache_key(request.cache_key)
    headers = merged_headers(endpoint.headers)
    return HttpCall(endpoint.url("/responses"), headers, body)


def prompt_cache_key(cache_key: str) -> str:
    """The ``prompt_cache_key`` for a conversation key (the session ID): stable per
    session, distinct between sessions, and not the ID itself (a SHA-256 prefix)."""
    digest = hashlib.sha256(f"magi-code prompt cache\0{cache_key}".encode()).hexdigest()
    return f"mc-{digest[:40]}"


class Input:
    """Responses input items, one per conversation item (``wire.Messages``): an item,
    once made, never changes."""

    def __init__(self) -> None:
        self.done: list[JsonObject] = []

    def add(self, item: ConversationItem) -> None:
        out = self.done
        if isinstance(item, UserText):
            content = [{"type": "input_text", "text": item.text}]
            out.append({"type": "message", "role": "user", "content": content})
        elif isinstance(item, AssistantText):
            if item.text:
                content = [{"type": "output_text", "text": item.text}]
                out.append({"type": "message", "role": "assistant", "content": content})
        elif isinstance(item, ToolCall):
            out.append(
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
        elif isinstance(item, ToolResult):
            out.append(
                {"type": "function_call_output", "call_id": item.call_id, "output": item.output}
            )
        elif item.api == "openai-responses":
            try:
                out.append(load_object(item.payload))
            except ProviderFailure:
                pass  # an unreadable stored item is dropped, not sent

    def rest(self) -> list[JsonObject]:
        return []


class Decoder:
    def __init__(self) -> None:
        self._streamed_text: set[object] = set()  # item keys that had text deltas
        self._summarised: set[object] = set()  # reasoning items whose summary was emitted
        self._tool_calls = 0
        # Function calls from the first one whose arguments are not a whole JSON object
        # on: emitted in order at the terminal event, which says whether the output limit
        # cut those arguments (then the call is dropped, see ``Completed``).
        self._held: list[ToolCall] = []
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = load_object(event.data)
        kind = text(data.get("type")) or event.event
        if kind == "response.output_text.delta":
            delta = text(data.get("delta"))
            self._streamed_text.add(_key(data))
            return [TextDelta(delta)] if delta else []
        if kind == "response.reasoning_summary_text.done":
            summary = text(data.get("text"))
            self._summarised.add(_key(data))
            return [ReasoningSummary(summary)] if summary else []
        if kind == "response.output_item.done":
            return self._item_done(data)
        if kind == "response.completed":
            response = obj(data.get("response"))
            if response.get("status") == "incomplete":
                return self._incomplete(response)
            stop: StopReason = "tool_use" if self._tool_calls else "end_turn"
            return self._terminal(response, stop)
        if kind == "response.incomplete":
            return self._incomplete(obj(data.get("response")))
        if kind == "response.failed":
            raise stream_failure(obj(data.get("response")).get("error"))
        if kind == "error":
            raise stream_failure(data)
        return []

    def finish(self) -> list[StreamEvent]:
        if not self._done:
            raise ProviderFailure(FailureLabel.STREAM_ERROR)
        return []

    def _incomplete(self, response: JsonObject) -> list[StreamEvent]:
        reason = obj(response.get("incomplete_details")).get("reason")
        if reason == "max_output_tokens":
            return self._terminal(response, "max_tokens")
        raise ProviderFailure(FailureLabel.INCOMPLETE)

    def _terminal(self, response: JsonObject, stop: StopReason) -> list[StreamEvent]:
        self._done = True
        cut = stop == "max_tokens"
        out: list[StreamEvent] = [
            ToolCallEvent(ToolCall(call.call_id, call.name, call.arguments or "{}"))
            for call in self._held
            if not cut or complete_arguments(call.arguments)
        ]
        usage = response.get("usage")
        if isinstance(usage, dict):
            cached = count(obj(usage.get("input_tokens_details")).get("cached_tokens"))
            details = obj(usage.get("output_tokens_details"))
            out.append(
                UsageEvent(
                    input_tokens=count(usage.get("input_tokens")),
                    output_tokens=count(usage.get("output_tokens")),
                    cache_read_tokens=cached,
                    cache_known=cached is not None,
                    reasoning_tokens=count(details.get("reasoning_tokens")),
                )
            )
        out.append(Completed(stop))
        return out

    def _item_done(self, data: JsonObject) -> list[StreamEvent]:
        item = obj(data.get("item"))
        kind = item.get("type")
        key = _key(data)
        if kind == "function_call":
            if item.get("status") == "incomplete":
                return []  # the output limit cut it: never run (see ``Completed``)
            self._tool_calls += 1
            arguments = text(item.get("arguments"))
            call = ToolCall(text(item.get("call_id")), text(item.get("name")), arguments)
            if self._held or not complete_arguments(arguments):
                self._held.append(call)
                return []
            return [ToolCallEvent(call)]
        if kind == "message" and key not in self._streamed_text:
            # Some servers send only the finished item; surface its text once.
            parts = [
                text(obj(part).get("text"))
                for part in _list(item.get("content"))
                if obj(part).get("type") == "output_text"
            ]
            joined = "".join(parts)
            return [TextDelta(joined)] if joined else []
        if kind == "reasoning":
            out: list[StreamEvent] = []
            if key not in self._summarised:
                for part in _list(item.get("summary")):
                    summary = text(obj(part).get("text"))
                    if obj(part).get("type") == "summary_text" and summary:
                        out.append(ReasoningSummary(summary))
            if text(item.get("encrypted_content")):
                # Echo form: server ids are not kept under store:false, so drop them.
                kept = {k: v for k, v in item.items() if k not in ("id", "status")}
                out.append(ContinuityItem("openai-responses", dumps(kept)))
            return out
        return []


def _key(data: JsonObject) -> object:
    """Identify an output item across its delta and done events."""
    item_id = data.get("item_id")
    if not isinstance(item_id, str):
        item_id = obj(data.get("item")).get("id")
    if isinstance(item_id, str) and item_id:
        return item_id
    return ("output_index", data.get("output_index"))


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []
