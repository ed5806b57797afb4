"""Model discovery per API against the fake provider's listings (providers.md §1, §2.6, §3)."""

from __future__ import annotations

import httpx
import pytest
from provider_helpers import API_KEY, endpoint_for
from tests.support.fake_providers import (
    SECRET_PROVIDER_TEXT,
    FakeModel,
    FakeProviderServer,
    HttpError,
)

from magi_code.providers import FailureLabel, ProviderFailure, list_models
from magi_code.providers.discovery import DiscoveredModel

MODELS = [
    FakeModel("claude-a", "Claude A", 200_000, 64_000),
    FakeModel("claude-b", None, None, None),
    FakeModel("claude-c", "Claude C", 1_000_000, 32_000),
    FakeModel("claude-d", "Claude D"),
    FakeModel("claude-e", "Claude E"),
]


async def test_anthropic_listing_follows_pages_with_after_id(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.models = MODELS
    fake.models_page_size = 2
    models = await list_models(client, endpoint_for(fake, "anthropic"))
    assert [m.model_id for m in models] == [
        "claude-a",
        "claude-b",
        "claude-c",
        "claude-d",
        "claude-e",
    ]
    assert models[0] == DiscoveredModel("claude-a", "Claude A", 200_000, 64_000, None)
    assert models[1].label == "claude-b"
    requests = fake.requests
    assert [r.query.get("after_id") for r in requests] == [None, "claude-b", "claude-d"]
    assert all(r.path == "/v1/models" for r in requests)
    assert all(r.headers["x-api-key"] == API_KEY for r in requests)
    assert all(r.headers["anthropic-version"] == "2023-06-01" for r in requests)


async def test_chat_listing_reads_openai_model_ids(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.models = MODELS[:2]
    models = await list_models(client, endpoint_for(fake, "openai-chat"))
    assert models == [
        DiscoveredModel("claude-a", "claude-a", None, None, None),
        DiscoveredModel("claude-b", "claude-b", None, None, None),
    ]
    assert fake.requests[0].path == "/v1/models"


async def test_codex_listing_sends_client_version_and_maps_reasoning_levels(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.models = [
        FakeModel("gpt-5.4", "GPT-5.4", 272_000, None, ("low", "medium", "high", "xhigh")),
        FakeModel("gpt-hidden", "Hidden", visibility="hide"),
        FakeModel("gpt-mini", None, 128_000, None, ("minimal", "low")),
    ]
    endpoint = endpoint_for(fake, "openai-responses")
    models = await list_models(client, endpoint, client_version="1.2.3")
    assert models == [
        DiscoveredModel("gpt-5.4", "GPT-5.4", 272_000, None, ("low", "medium", "high", "x_high")),
        DiscoveredModel("gpt-mini", "gpt-mini", 128_000, None, ("low",)),
    ]
    (request,) = fake.requests
    assert request.path == "/backend-api/codex/models"
    assert request.query == {"client_version": "1.2.3"}
    assert request.headers["chatgpt-account-id"] == "acct-123"


@pytest.mark.parametrize(
    ("status", "label"),
    [
        (401, FailureLabel.AUTH_FAILED),
        (500, FailureLabel.SERVER_ERROR),
        (404, FailureLabel.HTTP_ERROR),
    ],
)
async def test_listing_failures_are_labelled(
    status: int, label: FailureLabel, fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.listing_reply = HttpError(status)
    with pytest.raises(ProviderFailure) as info:
        await list_models(client, endpoint_for(fake, "openai-chat"))
    assert info.value.label is label
    assert SECRET_PROVIDER_TEXT not in str(info.value) + repr(info.value)


async def test_listing_that_is_not_json_is_a_stream_error(
    fake: FakeProviderServer, client: httpx.AsyncClient
) -> None:
    fake.listing_reply = HttpError(200, b"<html>")
    with pytest.raises(ProviderFailure) as info:
        await list_models(client, endpoint_for(fake, "anthropic"))
    assert info.value.label is FailureLabel.STREAM_ERROR
