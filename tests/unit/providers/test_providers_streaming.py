"""stream_response against the loopback fake provider, for each wire API.

Provenance: providers.md §1 (Anthropic SSE), §2.6 (Responses), §3 (chat completions);
the failure, retry and cancellation rules are from the providers brief.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from provider_helpers import (
    ACCESS_TOKEN,
    ACCOUNT_ID,
    API_KEY,
    APIS,
    FAST_RETRY,
    collect,
    endpoint_for,
    make_request,
)
from tests.support.fake_providers import (
    SECRET_PROVIDER_TEXT,
    FakeProviderServer,
    FakeToolCall,
    FakeUsage,
    Fast,
    HttpError,
    RawSSE,
    Reply,
)

from magi_code.providers import (
    ApiKind,
    AssistantText,
    Completed,
    ContinuityItem,
    Endpoint,
    FailureLabel,
    MessageCache,
    ProviderFailure,
    ReasoningSummary,
    RetryPolicy,
    StreamEvent,
    StreamSettings,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    UsageEvent,
    UserText,
    stream_response,
)

pytestmark = pytest.mark.timeout(30)
api_param = pytest.mark.parametrize("api", APIS)


def texts(events: list[StreamEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextDelta)]


async def failure_of(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    settings: StreamSettings = FAST_RETRY,
    seen: list[StreamEvent] | None = None,
) -> ProviderFailure:
    with pytest.raises(ProviderFailure) as info:
        async with asyncio.timeout(10):
            async for event in stream_response(client, endpoint, make_request(), settings):
                if seen is not None:
                    seen.append(event)
    failure = info.value
    assert str(failure) == failure.label.value
    assert SECRET_PROVIDER_TEXT not in str(failure) + repr(failure)
    return failure


@api_param
async def test_text_deltas_arrive_in_order_then_usage_then_completed(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["Hel", "lo", ", ", "world"], usage=FakeUsage(20, 9, 5, 2)))
    events = await collect(client, endpoint_for(fake, api))
    assert texts(events) == ["Hel", "lo", ", ", "world"]
    usage = [e for e in events if isinstance(e, UsageEvent)]
    assert len(usage) == 1
    assert (usage[0].input_tokens, usage[0].output_tokens) == (20, 9)
    assert (usage[0].cache_read_tokens, usage[0].cache_known) == (5, True)
    expected_reasoning = None if api == "anthropic" else 2
    assert usage[0].reasoning_tokens == expected_reasoning
    assert events[-2:] == [usage[0], Completed("end_turn")]


@api_param
async def test_tool_calls_are_assembled_from_fragments(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    calls = [
        FakeToolCall("call_a", "list_dir", '{"path": "src/magi"}'),
        FakeToolCall("call_b", "read_file", '{"path": "README.md", "limit": 10}'),
    ]
    fake.enqueue(Reply(text=["Let me look."], tool_calls=calls))
    events = await collect(client, endpoint_for(fake, api))
    got = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert got == [
        ToolCall("call_a", "list_dir", '{"path": "src/magi"}'),
        ToolCall("call_b", "read_file", '{"path": "README.md", "limit": 10}'),
    ]
    assert events[-1] == Completed("tool_use")


@api_param
async def test_reasoning_summary_only_from_verified_summary_events(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    """Anthropic thinking and chat reasoning_content are raw thinking, never summaries."""
    fake.enqueue(Reply(text=["ok"], reasoning_summary="**Planning** the change"))
    events = await collect(
        client,
        endpoint_for(
            fake,
            api,
        ),
        make_request(reasoning="high"),
    )
    summaries = [e.text for e in events if isinstance(e, ReasoningSummary)]
    if api == "openai-responses":
        assert summaries == ["**Planning** the change"]
    else:
        assert summaries == []
    assert texts(events) == ["ok"]


@pytest.mark.parametrize("api", ["anthropic", "openai-responses"])
async def test_continuity_items_are_kept_and_echoed_on_the_next_request(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(
        Reply(text=["x"], reasoning_summary="think", tool_calls=[FakeToolCall("c1", "ls", "{}")]),
        Reply(text=["done"]),
    )
    endpoint = endpoint_for(fake, api)
    first = await collect(client, endpoint, make_request(reasoning="high"))
    continuity = [e for e in first if isinstance(e, ContinuityItem)]
    assert len(continuity) == 1
    assert continuity[0].api == api
    history = [
        UserText("hi"),
        *continuity,
        AssistantText("x"),
        ToolCall("c1", "ls", "{}"),
        ToolResult("c1", "ls", "out", False),
    ]
    await collect(client, endpoint, make_request(history, reasoning="high"))
    second = fake.requests[1].json
    if api == "anthropic":
        assistant = second["messages"][1]["content"]
        assert assistant[0] == {"type": "thinking", "thinking": "think", "signature": "sig-fake"}
        assert second["messages"][2]["content"][0]["tool_use_id"] == "c1"
    else:
        reasoning = [i for i in second["input"] if i["type"] == "reasoning"]
        assert reasoning == [
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "think"}],
                "encrypted_content": "enc-fake",
            }
        ]


@api_param
async def test_request_on_the_wire_has_auth_headers_and_documented_body(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply())
    await collect(client, endpoint_for(fake, api))
    (recorded,) = fake.requests
    assert recorded.method == "POST"
    headers, body = recorded.headers, recorded.json
    assert headers["content-type"] == "application/json"
    assert body["stream"] is True
    if api == "anthropic":
        assert recorded.path == "/v1/messages"
        assert headers["x-api-key"] == API_KEY
        assert headers["anthropic-version"] == "2023-06-01"
        assert body["messages"][0]["role"] == "user"
    elif api == "openai-chat":
        assert recorded.path == "/v1/chat/completions"
        assert headers["authorization"] == f"Bearer {API_KEY}"
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert recorded.path == "/backend-api/codex/responses"
        assert headers["authorization"] == f"Bearer {ACCESS_TOKEN}"
        assert headers["chatgpt-account-id"] == ACCOUNT_ID
        assert body["store"] is False
        assert body["instructions"] == "You are a test."


@api_param
async def test_the_service_client_keeps_no_cookies_and_sends_cached_messages_as_built(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    """A provider's cookies are never kept nor sent back, and a request whose messages a
    message cache encoded sends the body a request built fresh sends."""
    cookie = {"set-cookie": "tracker=1; Path=/"}
    fake.enqueue(Reply(headers=cookie), Reply(headers=cookie), Reply(headers=cookie))
    endpoint = endpoint_for(fake, api)
    items = [UserText("hi"), AssistantText("hello"), UserText("more")]
    cache = MessageCache()
    await collect(client, endpoint, make_request(items[:1], message_cache=cache))
    await collect(client, endpoint, make_request(items, message_cache=cache))
    await collect(client, endpoint, make_request(items))
    first, cached, fresh = fake.requests
    assert all("cookie" not in sent.headers for sent in (first, cached, fresh))
    assert not client.cookies
    assert cached.body == fresh.body


@pytest.mark.parametrize(
    ("status", "body", "label"),
    [
        (401, None, FailureLabel.AUTH_FAILED),
        (403, None, FailureLabel.AUTH_FAILED),
        (400, None, FailureLabel.HTTP_ERROR),
        (404, None, FailureLabel.HTTP_ERROR),
        (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 300000 > 200000",
                },
            },
            FailureLabel.CONTEXT_LENGTH_EXCEEDED,
        ),
        (
            429,
            {"error": {"type": "usage_limit_reached", "plan_type": "plus", "resets_at": 1}},
            FailureLabel.QUOTA_EXCEEDED,
        ),
    ],
)
@api_param
async def test_non_retryable_statuses_map_to_labels_with_one_request(
    api: ApiKind,
    status: int,
    body: object,
    label: FailureLabel,
    fake: FakeProviderServer,
    client: httpx.AsyncClient,
) -> None:
    fake.enqueue(HttpError(status, body), Reply())
    failure = await failure_of(client, endpoint_for(fake, api))
    assert failure.label is label
    assert failure.status == status
    assert len(fake.requests) == 1


@api_param
async def test_429_with_retry_after_is_retried_after_the_hinted_delay(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    """Backoff is set to a minute: finishing within the timeout proves the header won."""
    slow_backoff = StreamSettings(retry=RetryPolicy(base_delay=60.0, max_delay=60.0))
    fake.enqueue(
        HttpError(429, retry_after="0.01"),
        HttpError(503, headers={"retry-after-ms": "5"}),
        Reply(text=["after retry"]),
    )
    async with asyncio.timeout(10):
        events = await collect(client, endpoint_for(fake, api), settings=slow_backoff)
    assert texts(events) == ["after retry"]
    assert len(fake.requests) == 3


async def test_a_retry_after_http_date_in_the_past_retries_at_once(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    """Backoff is set to a minute: finishing within the timeout proves the date was read."""
    slow_backoff = StreamSettings(retry=RetryPolicy(base_delay=60.0, max_delay=60.0))
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    fake.enqueue(HttpError(429, retry_after=past), Reply(text=["ok"]))
    async with asyncio.timeout(10):
        events = await collect(client, endpoint_for(fake, "openai-chat"), settings=slow_backoff)
    assert texts(events) == ["ok"]
    assert len(fake.requests) == 2


async def test_retry_after_beyond_the_cap_is_clamped(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    capped = StreamSettings(
        retry=RetryPolicy(base_delay=60.0, max_delay=60.0, max_retry_after=0.01)
    )
    fake.enqueue(HttpError(429, retry_after="3600"), Reply(text=["ok"]))
    async with asyncio.timeout(10):
        events = await collect(client, endpoint_for(fake, "openai-chat"), settings=capped)
    assert texts(events) == ["ok"]


async def test_persistent_5xx_gives_up_after_bounded_retries(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.set_default(HttpError(500))
    failure = await failure_of(client, endpoint_for(fake, "anthropic"))
    assert failure.label is FailureLabel.SERVER_ERROR
    assert len(fake.requests) == 1 + FAST_RETRY.retry.max_retries


async def test_connection_refused_is_retried_then_unavailable(
    client: httpx.AsyncClient,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = Endpoint("openai-chat", f"http://127.0.0.1:{port}/v1", {})
    failure = await failure_of(client, endpoint)
    assert failure.label is FailureLabel.UNAVAILABLE


@api_param
async def test_error_after_the_first_token_fails_without_retry(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["partial", "more"], after_chunks=1, ending="error_event"), Reply())
    seen: list[StreamEvent] = []
    failure = await failure_of(client, endpoint_for(fake, api), seen=seen)
    assert failure.label is FailureLabel.STREAM_ERROR
    assert texts(seen) == ["partial"]
    assert len(fake.requests) == 1


@api_param
async def test_in_stream_context_length_error_keeps_its_label(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(after_chunks=0, ending="error_event", error_code="context_length_exceeded"))
    failure = await failure_of(client, endpoint_for(fake, api))
    assert failure.label is FailureLabel.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.parametrize("ending", ["disconnect", "eof", "malformed"])
@api_param
async def test_broken_streams_are_stream_errors(
    api: ApiKind, ending: str, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["a", "b"], after_chunks=1, ending=ending))  # type: ignore[arg-type]
    seen: list[StreamEvent] = []
    failure = await failure_of(client, endpoint_for(fake, api), seen=seen)
    assert failure.label is FailureLabel.STREAM_ERROR
    assert texts(seen) == ["a"]
    assert not any(isinstance(e, Completed) for e in seen)
    assert len(fake.requests) == 1


async def test_frames_before_a_malformed_one_in_the_same_read_are_delivered_first(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    one_write = (
        b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"kept"}\n\n'
        b"event: response.output_text.delta\ndata: {not json\n\n"
    )
    fake.enqueue(RawSSE([one_write]))
    seen: list[StreamEvent] = []
    failure = await failure_of(client, endpoint_for(fake, "openai-responses"), seen=seen)
    assert failure.label is FailureLabel.STREAM_ERROR
    assert texts(seen) == ["kept"]


@api_param
async def test_cancelling_the_consumer_closes_the_connection(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["first", "never"], after_chunks=1, ending="stall"))
    first = asyncio.Event()

    async def consume() -> None:
        async for event in stream_response(client, endpoint_for(fake, api), make_request()):
            if isinstance(event, TextDelta):
                first.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(fake.wait_for_disconnects, 1, 5.0)


async def test_closing_the_generator_early_closes_the_connection(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["first", "never"], after_chunks=1, ending="stall"))
    endpoint = endpoint_for(fake, "openai-responses")
    async with aclosing(stream_response(client, endpoint, make_request())) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                break
    assert await asyncio.to_thread(fake.wait_for_disconnects, 1, 5.0)


@api_param
async def test_the_connection_is_reused_after_a_response_ends(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    # The agent stops reading at the terminal event; what follows it (the end of the
    # chunked body) is still read, so the next request takes the same connection.
    endpoint = endpoint_for(fake, api)
    for word in ("one", "two", "three"):
        fake.enqueue(Reply(text=[word]))
        async with aclosing(stream_response(client, endpoint, make_request())) as events:
            async for event in events:
                if isinstance(event, Completed):
                    break
    assert fake.connections == 1
    assert fake.disconnects == 0


async def test_a_response_going_on_past_its_terminal_event_costs_only_its_connection(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    frames = [
        b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n',
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"hi"}\n\n',
        b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r"}}\n\n',
        # More than is read past the terminal event: the connection is given up.
        b": " + b"x" * (128 * 1024) + b"\n\n",
    ]
    fake.enqueue(RawSSE(frames), Reply(text=["again"]))
    endpoint = endpoint_for(fake, "openai-responses")
    first = await collect(client, endpoint)
    assert first == [TextDelta("hi"), Completed("end_turn")]
    second = await collect(client, endpoint)
    assert texts(second) == ["again"]
    assert fake.connections == 2


async def test_idle_gap_longer_than_the_idle_timeout_is_a_timeout(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["a", "b"], after_chunks=1, ending="stall"))
    settings = StreamSettings(idle_timeout=0.2, retry=FAST_RETRY.retry)
    failure = await failure_of(client, endpoint_for(fake, "anthropic"), settings)
    assert failure.label is FailureLabel.TIMEOUT


async def test_chat_stream_without_done_completes_after_finish_and_usage(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(
        RawSSE(
            [
                b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
                b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n',
                b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n',
            ]
        )
    )
    events = await collect(client, endpoint_for(fake, "openai-chat"))
    assert texts(events) == ["hi"]
    assert events[-1] == Completed("max_tokens")
    usage = events[-2]
    assert isinstance(usage, UsageEvent)
    assert (usage.input_tokens, usage.cache_known) == (3, False)


async def test_chat_mid_stream_error_payload_fails(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(
        RawSSE([b'data: {"error":{"message":"' + SECRET_PROVIDER_TEXT.encode() + b'"}}\n\n'])
    )
    failure = await failure_of(client, endpoint_for(fake, "openai-chat"))
    assert failure.label is FailureLabel.STREAM_ERROR


@pytest.mark.parametrize("api", ["anthropic", "openai-chat", "openai-responses"])
async def test_output_cap_stop_is_max_tokens(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Reply(text=["trunc"], stop="max_tokens"))
    events = await collect(client, endpoint_for(fake, api))
    assert events[-1] == Completed("max_tokens")


async def test_responses_message_item_without_deltas_still_yields_its_text(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    """Codex's own minimal fixture: created → output_item.done(message) → completed."""
    item = (
        b'{"type":"response.output_item.done","output_index":0,"item":{"type":"message",'
        b'"role":"assistant","content":[{"type":"output_text","text":"whole"}]}}'
    )
    fake.enqueue(
        RawSSE(
            [
                b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n',
                b"event: response.output_item.done\ndata: " + item + b"\n\n",
                b'event: response.completed\ndata: {"type":"response.completed",'
                b'"response":{"id":"r"}}\n\n',
            ]
        )
    )
    events = await collect(client, endpoint_for(fake, "openai-responses"))
    assert events == [TextDelta("whole"), Completed("end_turn")]


@api_param
async def test_fast_mode_streams_many_deltas_in_order(
    api: ApiKind, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.enqueue(Fast(count=3000, text="ab"))
    events = await collect(client, endpoint_for(fake, api))
    assert "".join(texts(events)) == "ab" * 3000
    assert isinstance(events[-1], Completed)
