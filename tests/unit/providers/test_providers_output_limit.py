"""A response the output-token limit ended: ``Completed("max_tokens")``, and a tool call
the limit cut short is never emitted (the agent would otherwise run it with half its
arguments). Every API against the loopback fake provider's real stream formats."""

from __future__ import annotations

import json

import httpx
import pytest
from provider_helpers import APIS, collect, endpoint_for
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, RawSSE, Reply

from magi_code.providers import ApiKind, Completed, ToolCall, ToolCallEvent
from magi_code.providers.types import complete_arguments

api_param = pytest.mark.parametrize("api", APIS)

WHOLE = FakeToolCall("call_whole", "list_dir", '{"path": "src"}')
CUT = FakeToolCall("call_cut", "shell", '{"command": "rm -rf bui')


def _calls(events: list[object]) -> list[ToolCall]:
    return [e.call for e in events if isinstance(e, ToolCallEvent)]


def test_complete_arguments_tells_a_whole_object_from_a_prefix() -> None:
    whole = '{"a": {"b": [1, 2]}, "c": "}"}'
    assert complete_arguments(whole)
    assert complete_arguments(whole + "  \n")
    for end in range(len(whole)):
        assert not complete_arguments(whole[:end]), whole[:end]
    assert not complete_arguments("[1]")
    assert not complete_arguments('"text"')


@api_param
async def test_a_call_cut_by_the_output_limit_is_dropped_and_the_whole_one_kept(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["Working"], tool_calls=[WHOLE, CUT], stop="max_tokens"))
    events = await collect(client, endpoint_for(fake, api))
    assert _calls(events) == [ToolCall("call_whole", "list_dir", '{"path": "src"}')]
    assert events[-1] == Completed("max_tokens")


@api_param
async def test_a_call_cut_before_any_argument_is_dropped(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=[], tool_calls=[FakeToolCall("c", "shell", "")], stop="max_tokens"))
    events = await collect(client, endpoint_for(fake, api))
    assert _calls(events) == []
    assert events[-1] == Completed("max_tokens")


@api_param
async def test_without_the_limit_bad_arguments_still_reach_the_agent_in_order(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    """Invalid JSON the model finished is its own mistake: the tool reports it."""
    bad = FakeToolCall("call_bad", "shell", '{"command": ')
    fake.enqueue(Reply(text=[], tool_calls=[bad, WHOLE]))
    events = await collect(client, endpoint_for(fake, api))
    assert [c.call_id for c in _calls(events)] == ["call_bad", "call_whole"]
    assert _calls(events)[0].arguments == '{"command": '
    assert events[-1] == Completed("tool_use")


def _sse(data: dict[str, object]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


async def test_responses_item_marked_incomplete_is_dropped_and_completed_incomplete_is_cut(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    item = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell"}
    response = {
        "id": "resp_1",
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "usage": {"input_tokens": 5, "output_tokens": 9},
    }
    frames = [
        _sse({"type": "response.created", "response": {"id": "resp_1"}}),
        _sse(
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": {**item, "arguments": '{"command": "ls"}', "status": "incomplete"},
            }
        ),
        _sse({"type": "response.completed", "response": response}),
    ]
    fake.enqueue(RawSSE(frames))
    events = await collect(client, endpoint_for(fake, "openai-responses"))
    assert _calls(events) == []
    assert events[-1] == Completed("max_tokens")
