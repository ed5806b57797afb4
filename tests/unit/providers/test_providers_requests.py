"""Request bodies and headers per wire API (providers.md §1, §2.6, §3), built sans-IO."""

from __future__ import annotations

import json

import pytest
from provider_helpers import LS_TOOL, make_request

from magi_code.providers import (
    AssistantText,
    ContinuityItem,
    Endpoint,
    ToolCall,
    ToolResult,
    UserText,
    build_call,
)

THINKING = ContinuityItem("anthropic", '{"type":"thinking","thinking":"t","signature":"s"}')
REASONING = ContinuityItem(
    "openai-responses",
    '{"type":"reasoning","summary":[],"encrypted_content":"enc"}',
)
HISTORY = (
    UserText("list files"),
    THINKING,
    REASONING,
    AssistantText("Looking."),
    ToolCall("call_1", "list_dir", '{"path": "."}'),
    ToolCall("call_2", "list_dir", '{"path": "src"}'),
    ToolResult("call_1", "list_dir", "a.txt", False),
    ToolResult("call_2", "list_dir", "no such dir", True),
    UserText("thanks"),
)


def headers_lower(call_headers: object) -> dict[str, str]:
    assert isinstance(call_headers, dict)
    return {k.lower(): v for k, v in call_headers.items()}


@pytest.mark.parametrize(
    ("api", "base", "url"),
    [
        ("anthropic", "https://api.anthropic.com/", "https://api.anthropic.com/v1/messages"),
        ("openai-chat", "http://127.0.0.1:1/v1//", "http://127.0.0.1:1/v1/chat/completions"),
        (
            "openai-responses",
            "https://chatgpt.com/backend-api/codex",
            "https://chatgpt.com/backend-api/codex/responses",
        ),
    ],
)
def test_urls_join_base_and_path_without_double_slashes(api: str, base: str, url: str) -> None:
    call = build_call(Endpoint(api, base, {}), make_request())  # type: ignore[arg-type]
    assert call.url == url


def test_anthropic_body_groups_blocks_and_sets_version_header() -> None:
    endpoint = Endpoint("anthropic", "https://a", {"x-api-key": "k"})
    call = build_call(endpoint, make_request(HISTORY, reasoning="high"))
    headers = headers_lower(dict(call.headers))
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["x-api-key"] == "k"
    body = call.body
    assert body["stream"] is True
    assert body["max_tokens"] == 4096
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096 - 1024}
    assert body["system"][0]["text"] == "You are a test."  # type: ignore[index]
    assert body["tools"] == [
        {
            "name": "list_dir",
            "description": "List a directory",
            "input_schema": LS_TOOL.parameters,
            "cache_control": {"type": "ephemeral"},
        }
    ]
    messages = body["messages"]
    assert isinstance(messages, list)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assistant = messages[1]["content"]
    # Thinking leads; the Responses reasoning item is not sent to Anthropic.
    assert [b["type"] for b in assistant] == ["thinking", "text", "tool_use", "tool_use"]
    assert assistant[0] == {"type": "thinking", "thinking": "t", "signature": "s"}
    assert assistant[2] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "list_dir",
        "input": {"path": "."},
    }
    results = messages[2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert results[1] == {
        "type": "tool_result",
        "tool_use_id": "call_2",
        "content": "no such dir",
        "is_error": True,
    }
    assert results[-1]["cache_control"] == {"type": "ephemeral"}


def test_anthropic_default_reasoning_omits_thinking_and_tiny_caps_skip_it() -> None:
    endpoint = Endpoint("anthropic", "https://a", {})
    assert "thinking" not in build_call(endpoint, make_request()).body
    small = build_call(endpoint, make_request(reasoning="max", max_output_tokens=1500)).body
    assert "thinking" not in small
    big = build_call(endpoint, make_request(reasoning="low", max_output_tokens=64000)).body
    assert big["thinking"] == {"type": "enabled", "budget_tokens": 2048}


def test_chat_body_has_usage_option_tool_calls_and_tool_messages() -> None:
    endpoint = Endpoint("openai-chat", "http://x/v1", {"Authorization": "Bearer k"})
    call = build_call(endpoint, make_request(HISTORY, reasoning="medium", fast=True))
    assert headers_lower(dict(call.headers))["authorization"] == "Bearer k"
    body = call.body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["reasoning_effort"] == "medium"
    assert "service_tier" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "list_dir",
                "description": "List a directory",
                "parameters": LS_TOOL.parameters,
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "list_dir", "arguments": '{"path": "."}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "list_dir", "arguments": '{"path": "src"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": "no such dir"},
        {"role": "user", "content": "thanks"},
    ]


def test_chat_default_reasoning_sends_no_effort() -> None:
    call = build_call(Endpoint("openai-chat", "http://x", {}), make_request())
    assert "reasoning_effort" not in call.body


def test_responses_body_matches_the_chatgpt_backend_shape() -> None:
    endpoint = Endpoint("openai-responses", "http://x", {"ChatGPT-Account-ID": "acct"})
    request = make_request(HISTORY, reasoning="x_high", fast=True)
    call = build_call(endpoint, request)
    body = call.body
    assert body["store"] is False
    assert body["stream"] is True
    assert body["instructions"] == "You are a test."
    assert body["reasoning"] == {"effort": "xhigh", "summary": "auto"}
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["service_tier"] == "priority"
    assert "max_output_tokens" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "name": "list_dir",
            "description": "List a directory",
            "strict": False,
            "parameters": LS_TOOL.parameters,
        }
    ]
    assert body["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "list files"}],
        },
        json.loads(REASONING.payload),
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Looking."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "list_dir",
            "arguments": '{"path": "."}',
        },
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "list_dir",
            "arguments": '{"path": "src"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "call_2", "output": "no such dir"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]
    assert headers_lower(dict(call.headers))["accept"] == "text/event-stream"


def test_responses_default_reasoning_and_normal_tier_omit_those_fields() -> None:
    body = build_call(Endpoint("openai-responses", "http://x", {}), make_request()).body
    assert "reasoning" not in body
    assert "include" not in body
    assert "service_tier" not in body
