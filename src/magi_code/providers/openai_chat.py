"""OpenAI-compatible Chat Completions: request building and SSE decoding (providers.md §3).

Stream: ``data:`` chunks with ``choices[0].delta`` (content, tool_call fragments keyed
by ``index``), a chunk with ``finish_reason``, then (``include_usage``) a
``choices: []`` chunk with ``usage``, then ``data: [DONE]``. A stream is complete at
``[DONE]``, or at EOF once both the finish reason and usage arrived (some compatible
servers omit ``[DONE]``). Raw ``delta.reasoning``/``reasoning_content`` is not a
verified summary and is dropped.
"""

from __future__ import annotations

from typing import Final

from magi_code.dataclass import dataclass, field
from magi_code.providers.errors import FailureLabel, ProviderFailure, stream_failure
from magi_code.providers.sse import SSEEvent
from magi_code.providers.types import (
    AssistantText,
    Completed,
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
    REASONING_EFFORT,
    HttpCall,
    JsonObject,
    count,
    load_object,
    merged_headers,
    messages_value,
    obj,
)

_FINISH: Final[dict[str, StopReason]] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


def build_call(endpoint: Endpoint, request: ProviderRequest) -> HttpCall:
    body: JsonObject = {
        "model": request.model,
        "messages": messages_value(request, Messages, request.system),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.parameters),
                },
            }
            for t in request.tools
        ]
        body["tool_choice"] = "auto"
    effort = REASONING_EFFORT.get(request.reasoning)
    if effort is not None:
        body["reasoning_effort"] = effort
    if request.max_output_tokens > 0:
        # ``max_tokens`` (not ``max_completion_tokens``): the field local servers know.
        body["max_tokens"] = request.max_output_tokens
    headers = merged_headers(endpoint.headers)
    return HttpCall(endpoint.url("/chat/completions"), headers, body)


class Messages:
    """Chat messages item by item (``wire.Messages``): the assistant's text and tool
    calls gather in one message until anything else comes, which ends it."""

    def __init__(self, system: str) -> None:
        self.done: list[JsonObject] = [{"role": "system", "content": system}] if system else []
        self._assistant: JsonObject | None = None  # the open assistant message

    def add(self, item: ConversationItem) -> None:
        if isinstance(item, (AssistantText, ToolCall)):
            assistant = self._assistant
            if assistant is None:
                assistant = self._assistant = {"role": "assistant", "content": None}
            if isinstance(item, AssistantText):
                previous = assistant["content"]
                assistant["content"] = (previous if isinstance(previous, str) else "") + item.text
            else:
                calls = assistant.setdefault("tool_calls", [])
                assert isinstance(calls, list)
                calls.append(
                    {
                        "id": item.call_id,
                        "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments},
                    }
                )
            return
        if isinstance(item, UserText):
            message: JsonObject = {"role": "user", "content": item.text}
        elif isinstance(item, ToolResult):
            message = {"role": "tool", "tool_call_id": item.call_id, "content": item.output}
        else:
            return  # continuity items belong to other APIs
        if self._assistant is not None:
            self.done.append(self._assistant)
            self._assistant = None
        self.done.append(message)

    def rest(self) -> list[JsonObject]:
        return [] if self._assistant is None else [self._assistant]


@dataclass(slots=True)
class _Fragment:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class Decoder:
    def __init__(self) -> None:
        self._calls: dict[int, _Fragment] = {}
        self._last_index = 0
        self._finish: StopReason | None = None
        self._usage: UsageEvent | None = None
        self._calls_emitted = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        # Every chunk of a reply comes through here: no helper calls on the usual path.
        if event.done:
            return self._complete()
        data = load_object(event.data)
        if "error" in data:
            raise stream_failure(data)
        out: list[StreamEvent] = []
        usage = data.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage_event(usage)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return out
        choice = choices[0]
        if not isinstance(choice, dict):
            return out
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if content and isinstance(content, str):
                out.append(TextDelta(content))
            fragments = delta.get("tool_calls")
            if isinstance(fragments, list):
                for fragment in fragments:
                    self._fragment(fragment if isinstance(fragment, dict) else {})
        reason = choice.get("finish_reason")
        if reason and isinstance(reason, str):
            self._finish = _FINISH.get(reason, "other")
            out.extend(self._emit_calls())
        return out

    def finish(self) -> list[StreamEvent]:
        if self._done:
            return []
        if self._finish is not None and self._usage is not None:
            return self._complete()
        raise ProviderFailure(FailureLabel.STREAM_ERROR)

    def _complete(self) -> list[StreamEvent]:
        self._done = True
        out = self._emit_calls()
        if self._usage is not None:
            out.append(self._usage)
        stop = self._finish
        if stop is None:  # [DONE] without a finish chunk: judge by what arrived
            stop = "tool_use" if self._calls else "end_turn"
        out.append(Completed(stop))
        return out

    def _emit_calls(self) -> list[StreamEvent]:
        if self._calls_emitted:
            return []
        self._calls_emitted = True
        # ``length``: the output limit may have cut the last call's arguments (see
        # ``Completed``); such a call is dropped.
        cut = self._finish == "max_tokens"
        out: list[StreamEvent] = []
        for _, f in sorted(self._calls.items()):
            arguments = "".join(f.arguments)
            if not cut or complete_arguments(arguments):
                out.append(ToolCallEvent(ToolCall(f.call_id, f.name, arguments or "{}")))
        return out

    def _fragment(self, fragment: JsonObject) -> None:
        call_id = fragment.get("id")
        if not isinstance(call_id, str):
            call_id = ""
        index = fragment.get("index")
        if type(index) is not int:  # absent, or not an integer (a bool is not one)
            # Tolerate servers that omit ``index``: match by id, else continue the last.
            by_id = [i for i, f in self._calls.items() if call_id and f.call_id == call_id]
            if by_id:
                index = by_id[0]
            elif call_id and self._calls:
                index = max(self._calls) + 1
            else:
                index = self._last_index
        self._last_index = index
        state = self._calls.get(index)
        if state is None:
            state = self._calls[index] = _Fragment()
        if call_id:
            state.call_id = call_id
        function = fragment.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if name and isinstance(name, str):
                state.name = name
            arguments = function.get("arguments")
            if arguments and isinstance(arguments, str):
                state.arguments.append(arguments)


def _usage_event(usage: JsonObject) -> UsageEvent:
    cached = count(obj(usage.get("prompt_tokens_details")).get("cached_tokens"))
    return UsageEvent(
        input_tokens=count(usage.get("prompt_tokens")),
        output_tokens=count(usage.get("completion_tokens")),
        cache_read_tokens=cached,
        cache_known=cached is not None,
        reasoning_tokens=count(obj(usage.get("completion_tokens_details")).get("reasoning_tokens")),
    )
