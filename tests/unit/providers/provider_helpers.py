"""Helpers shared by the provider tests (endpoints, requests, event collection)."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
from tests.support.fake_providers import FakeProviderServer

from magi_code.providers import (
    ApiKind,
    ConversationItem,
    Endpoint,
    MessageCache,
    ProviderRequest,
    ReasoningLevel,
    RetryPolicy,
    StreamEvent,
    StreamSettings,
    ToolSpec,
    UserText,
    stream_response,
)

API_KEY = "sk-test-secret-key"
ACCESS_TOKEN = "codex-access-token"
ACCOUNT_ID = "acct-123"
APIS: tuple[ApiKind, ...] = ("anthropic", "openai-chat", "openai-responses")

# Retries stay real but fast: tiny backoff, so a test that retries takes milliseconds.
FAST_RETRY = StreamSettings(retry=RetryPolicy(base_delay=0.001, max_delay=0.01))

LS_TOOL = ToolSpec(
    "list_dir",
    "List a directory",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def endpoint_for(fake: FakeProviderServer, api: ApiKind) -> Endpoint:
    """Endpoints shaped as the auth/config layers build them (auth headers included)."""
    if api == "anthropic":
        return Endpoint(api, fake.base_url, {"x-api-key": API_KEY})
    if api == "openai-chat":
        return Endpoint(api, fake.base_url + "/v1/", {"Authorization": f"Bearer {API_KEY}"})
    headers = {"Authorization": f"Bearer {ACCESS_TOKEN}", "ChatGPT-Account-ID": ACCOUNT_ID}
    return Endpoint(api, fake.base_url + "/backend-api/codex", headers)


def make_request(
    items: Sequence[ConversationItem] = (UserText("hi"),),
    *,
    reasoning: ReasoningLevel = "default",
    fast: bool = False,
    tools: Sequence[ToolSpec] = (LS_TOOL,),
    max_output_tokens: int = 4096,
    system: str = "You are a test.",
    message_cache: MessageCache | None = None,
) -> ProviderRequest:
    return ProviderRequest(
        model="fake-model",
        system=system,
        items=items,
        tools=tools,
        reasoning=reasoning,
        fast=fast,
        max_output_tokens=max_output_tokens,
        message_cache=message_cache,
    )


async def collect(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    request: ProviderRequest | None = None,
    settings: StreamSettings = FAST_RETRY,
) -> list[StreamEvent]:
    return [
        event
        async for event in stream_response(client, endpoint, request or make_request(), settings)
    ]
