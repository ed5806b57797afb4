"""Catalog projections, cache states and refresh against loopback model listings
(spec "Provider and model catalogs")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from config_helpers import NOW, ModelServer, read_json, seed_catalog, write_json

from magi_code.config.catalog import (
    CATALOG_TTL_SECONDS,
    CatalogModel,
    cache_path,
    model_page,
    provider_page,
    refresh,
)
from magi_code.config.settings import load_settings
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.operations import declared
from magi_code.storage.launch import LaunchContext

SECRET = "sk-live-abcdefghijklmnopqrstuvwxyz0123456789"


def models(ctx: LaunchContext, provider_id: str, now: float = NOW, **page: int) -> dict[str, Any]:
    return model_page(ctx, load_settings(ctx), provider_id, now=lambda: now, **page)


def local_provider(ctx: LaunchContext, base_url: str, **extra: Any) -> None:
    write_json(
        ctx.global_settings_path,
        {"providers": {"local": {"api": "openai-chat", "base_url": base_url, **extra}}},
    )


# -- providers ---------------------------------------------------------------------------


def test_provider_page_lists_builtins_and_custom_sorted(ctx: LaunchContext) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "providers": {
                "zz": {
                    "api": "openai-chat",
                    "base_url": "http://h/v1",
                    "label": "Zed\u202e\x07 Local",
                },
                "aa": {"api": "openai-chat", "base_url": "http://h/v1", "label": "   "},
            }
        },
    )
    page = provider_page(ctx, load_settings(ctx))
    assert page == {
        "entries": [
            {"provider_id": "aa", "label": "aa"},
            {"provider_id": "anthropic", "label": "anthropic"},
            {"provider_id": "openai-codex", "label": "openai-codex"},
            {"provider_id": "zz", "label": "Zed Local"},
        ],
        "next_offset": None,
        "refresh": "cache_only",
    }


def test_provider_paging_edges(ctx: LaunchContext) -> None:
    settings = load_settings(ctx)
    first = provider_page(ctx, settings, offset=0, limit=1)
    assert [e["provider_id"] for e in first["entries"]] == ["anthropic"]
    assert first["next_offset"] == 1
    last = provider_page(ctx, settings, offset=1, limit=1)
    assert [e["provider_id"] for e in last["entries"]] == ["openai-codex"]
    assert last["next_offset"] is None
    beyond = provider_page(ctx, settings, offset=100_000, limit=32)
    assert beyond == {"entries": [], "next_offset": None, "refresh": "cache_only"}


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (None, ErrorCode.INVALID_PAYLOAD),
        ({"offset": 0, "extra": 1}, ErrorCode.INVALID_PAYLOAD),
        ({"offset": None}, ErrorCode.INVALID_PAYLOAD),
        ({"limit": True}, ErrorCode.INVALID_PAYLOAD),
        ({"limit": 1.0}, ErrorCode.INVALID_PAYLOAD),
        ({"offset": "0"}, ErrorCode.INVALID_PAYLOAD),
        ({"offset": -1}, ErrorCode.INVALID_PAYLOAD),
        ({"limit": 0}, ErrorCode.INVALID_PAYLOAD),
        ({"limit": 33}, ErrorCode.LIMIT_EXCEEDED),
        ({"offset": 100_001}, ErrorCode.LIMIT_EXCEEDED),
    ],
)
def test_provider_page_payload_errors(payload: Any, code: ErrorCode) -> None:
    with pytest.raises(ServiceError) as info:
        declared("catalog.providers").check(payload, None)
    assert info.value.code is code


def test_page_payload_bounds() -> None:
    def check(method: str, payload: Any) -> None:
        declared(method).check(payload, None)

    check("catalog.providers", {})
    check("catalog.providers", {"offset": 100_000, "limit": 1})
    check("catalog.models", {"provider_id": "anthropic"})
    check("catalog.refresh", {"provider_id": "x"})
    check("config.get", {})
    for bad in ({"provider_id": 1}, {}, {"provider_id": "a", "limit": 40}, {"provider_id": None}):
        with pytest.raises(ServiceError):
            check("catalog.models", bad)
    for bad in ({}, {"provider_id": "a", "offset": 0}):
        with pytest.raises(ServiceError):
            check("catalog.refresh", bad)
    with pytest.raises(ServiceError) as info:
        check("config.get", {"x": 1})
    assert info.value.code is ErrorCode.INVALID_PAYLOAD


# -- model pages and cache states --------------------------------------------------------


def test_missing_cache_is_unavailable(ctx: LaunchContext) -> None:
    assert models(ctx, "anthropic") == {
        "entries": [],
        "next_offset": None,
        "state": "unavailable",
        "refresh": "cache_only",
    }


@pytest.mark.parametrize("provider_id", ["nope", "bad id", "../x", SECRET])
def test_unknown_or_unsafe_provider_is_invalid_selection(
    ctx: LaunchContext, provider_id: str
) -> None:
    with pytest.raises(ServiceError) as info:
        models(ctx, provider_id)
    assert info.value.code is ErrorCode.INVALID_SELECTION


def test_fresh_cache_entries_and_disabled_models(ctx: LaunchContext) -> None:
    write_json(ctx.project_settings_path, {"disabled_models": {"anthropic": ["claude-b"]}})
    seed_catalog(
        ctx,
        "anthropic",
        [
            CatalogModel("claude-a", "Claude A", 200_000, 64_000, ("default", "high")),
            CatalogModel("claude-b", "Claude B"),
        ],
    )
    page = models(ctx, "anthropic")
    assert page["state"] == "fresh_cache"
    assert page["entries"] == [
        {
            "provider_id": "anthropic",
            "model_id": "claude-a",
            "label": "Claude A",
            "available": True,
            "context_window": 200_000,
            "max_output_tokens": 64_000,
            "available_thinking_levels": ["default", "high"],
        },
        {
            "provider_id": "anthropic",
            "model_id": "claude-b",
            "label": "Claude B",
            "available": False,
            "context_window": None,
            "max_output_tokens": None,
            "available_thinking_levels": ["default", "low", "medium", "high", "max"],
        },
    ]


def test_cache_expiry_with_injected_clock(ctx: LaunchContext) -> None:
    seed_catalog(ctx, "anthropic", [CatalogModel("claude-a", "A", reasoning_levels=("default",))])
    assert models(ctx, "anthropic", now=NOW + CATALOG_TTL_SECONDS - 1)["state"] == "fresh_cache"
    stale = models(ctx, "anthropic", now=NOW + CATALOG_TTL_SECONDS)
    assert stale["state"] == "stale"
    assert [e["available"] for e in stale["entries"]] == [False]
    # Stale metadata no longer informs reasoning choices: the provider fallback applies.
    assert stale["entries"][0]["available_thinking_levels"] == [
        "default",
        "low",
        "medium",
        "high",
        "max",
    ]
    # A fetch time far in the future (clock moved back) is not trusted as fresh either.
    assert models(ctx, "anthropic", now=NOW - 3600)["state"] == "stale"


def test_configuration_change_makes_cache_unavailable(
    make_ctx: Callable[..., LaunchContext],
) -> None:
    ctx = make_ctx()
    seed_catalog(ctx, "anthropic", [CatalogModel("claude-a", "A")])
    moved = make_ctx(ANTHROPIC_BASE_URL="http://127.0.0.1:1")
    assert models(moved, "anthropic")["state"] == "unavailable"
    assert models(ctx, "anthropic")["state"] == "fresh_cache"
    local_provider(ctx, "http://127.0.0.1:1/v1")
    seed_catalog(ctx, "local", [CatalogModel("m", "M")])
    local_provider(ctx, "http://127.0.0.1:2/v1")
    assert models(ctx, "local")["state"] == "unavailable"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda doc: b"{not json",
        lambda doc: b"[]",
        lambda doc: {**doc, "version": 2},
        lambda doc: {**doc, "provider_id": "openai-codex"},
        lambda doc: {**doc, "fetched_at": "yesterday"},
        lambda doc: {**doc, "fetched_at": True},
        lambda doc: {**doc, "models": []},
        lambda doc: {**doc, "models": {"claude-a": {}}},
        lambda doc: {**doc, "models": ["claude-a"]},
        lambda doc: {**doc, "models": [{"label": "no id"}]},
        lambda doc: {**doc, "models": [{"model_id": SECRET}]},
        lambda doc: {k: v for k, v in doc.items() if k != "fingerprint"},
    ],
)
def test_malformed_cache_is_unavailable(
    ctx: LaunchContext, mutate: Callable[[dict[str, Any]], Any]
) -> None:
    seed_catalog(ctx, "anthropic", [CatalogModel("claude-a", "A")])
    path = cache_path(ctx, "anthropic")
    changed = mutate(read_json(path))
    if isinstance(changed, bytes):
        path.write_bytes(changed)
    else:
        write_json(path, changed)
    assert models(ctx, "anthropic")["state"] == "unavailable"
    assert models(ctx, "anthropic")["entries"] == []


def test_cached_entries_are_filtered_deduplicated_and_bounded(ctx: LaunchContext) -> None:
    seed_catalog(ctx, "anthropic", [CatalogModel("claude-a", "A")])
    path = cache_path(ctx, "anthropic")
    document = read_json(path)
    long_label = "é" * 100  # 200 UTF-8 bytes
    document["models"] = [
        {"model_id": "m-2", "label": "Second"},
        {"model_id": SECRET, "label": "secret"},
        {"model_id": "Bearer-abc", "label": "token"},
        {"model_id": "has space", "label": "bad"},
        {"model_id": "x" * 257, "label": "too long"},
        {"model_id": "m-1", "label": long_label, "context_window": True, "max_output_tokens": -5},
        {"model_id": "m-2", "label": "duplicate"},
        {
            "model_id": "m-3",
            "label": "\x1b[31mred\x1b[0m\u200b",
            "reasoning_levels": ["high", "ultra"],
        },
        {"model_id": "m-4", "label": SECRET},
    ]
    write_json(path, document)
    entries = models(ctx, "anthropic")["entries"]
    assert [e["model_id"] for e in entries] == ["m-2", "m-1", "m-3", "m-4"]
    assert entries[0]["label"] == "Second"
    label = entries[1]["label"]
    assert len(label.encode()) <= 128 and label == "é" * 64
    assert (entries[1]["context_window"], entries[1]["max_output_tokens"]) == (None, None)
    assert entries[2]["label"] == "[31mred[0m"
    assert entries[2]["available_thinking_levels"] == ["default", "high"]
    assert entries[3]["label"] == "m-4"


def test_model_paging(ctx: LaunchContext) -> None:
    seed_catalog(ctx, "anthropic", [CatalogModel(f"m-{i:02d}", f"M{i}") for i in range(40)])
    first = models(ctx, "anthropic")
    assert len(first["entries"]) == 32
    assert first["next_offset"] == 32
    second = models(ctx, "anthropic", offset=32)
    assert [e["model_id"] for e in second["entries"]] == [f"m-{i:02d}" for i in range(32, 40)]
    assert second["next_offset"] is None
    assert models(ctx, "anthropic", offset=40)["entries"] == []
    with pytest.raises(ServiceError) as info:
        models(ctx, "anthropic", limit=33)
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED


def test_custom_provider_context_window_applies_to_unknown_model_windows(
    ctx: LaunchContext,
) -> None:
    local_provider(ctx, "http://127.0.0.1:1/v1", context_window=4096)
    seed_catalog(ctx, "local", [CatalogModel("m", "M"), CatalogModel("n", "N", context_window=99)])
    entries = models(ctx, "local")["entries"]
    assert [e["context_window"] for e in entries] == [4096, 99]
    assert entries[0]["available_thinking_levels"] == ["default"]


# -- refresh -----------------------------------------------------------------------------


async def test_refresh_custom_provider_writes_fresh_cache(
    ctx: LaunchContext, model_server: ModelServer
) -> None:
    model_server.routes["/v1/models"] = (
        200,
        {
            "object": "list",
            "data": [
                {"id": "qwen3:8b", "object": "model"},
                {"id": SECRET, "object": "model"},
                {"id": "llama3.1", "object": "model"},
            ],
        },
    )
    local_provider(ctx, model_server.base + "/v1", api_key_env="LOCAL_KEY")
    async with httpx.AsyncClient() as client:
        result = await refresh(
            ctx, load_settings(ctx), "local", client, {"authorization": "Bearer k"}, lambda: NOW
        )
    assert result == {"provider_id": "local", "state": "fresh_cache"}
    assert model_server.requests[0][0] == "/v1/models"
    assert model_server.requests[0][1]["authorization"] == "Bearer k"
    page = models(ctx, "local")
    assert [e["model_id"] for e in page["entries"]] == ["qwen3:8b", "llama3.1"]
    assert all(e["available"] for e in page["entries"])
    assert SECRET not in cache_path(ctx, "local").read_text()


async def test_refresh_builtin_anthropic_against_loopback(
    make_ctx: Callable[..., LaunchContext], model_server: ModelServer
) -> None:
    model_server.routes["/v1/models"] = (
        200,
        {
            "data": [
                {"id": "claude-x", "display_name": "Claude X", "max_input_tokens": 200000},
            ],
            "has_more": False,
            "first_id": "claude-x",
            "last_id": "claude-x",
        },
    )
    ctx = make_ctx(ANTHROPIC_BASE_URL=model_server.base)
    async with httpx.AsyncClient() as client:
        result = await refresh(ctx, load_settings(ctx), "anthropic", client, {}, lambda: NOW)
    assert result == {"provider_id": "anthropic", "state": "fresh_cache"}
    [entry] = models(ctx, "anthropic")["entries"]
    assert (entry["model_id"], entry["label"], entry["context_window"]) == (
        "claude-x",
        "Claude X",
        200000,
    )


@pytest.mark.parametrize(
    "route",
    [
        (500, {"error": {"message": f"internal failure for key {SECRET}"}}),
        (401, {"error": {"type": "authentication_error", "message": SECRET}}),
        (200, {"object": "list", "data": []}),
        (200, {"object": "list", "data": [{"id": SECRET}]}),
        (200, {"unexpected": True}),
    ],
)
async def test_refresh_failure_is_catalog_refresh_failed_and_keeps_old_cache(
    ctx: LaunchContext, model_server: ModelServer, route: tuple[int, Any]
) -> None:
    local_provider(ctx, model_server.base + "/v1")
    seed_catalog(ctx, "local", [CatalogModel("old", "Old")])
    before = cache_path(ctx, "local").read_bytes()
    model_server.routes["/v1/models"] = route
    async with httpx.AsyncClient() as client:
        with pytest.raises(ServiceError) as info:
            await refresh(ctx, load_settings(ctx), "local", client, {}, lambda: NOW + 10)
    assert info.value.code is ErrorCode.CATALOG_REFRESH_FAILED
    assert SECRET not in str(info.value) and SECRET not in info.value.message
    # Provider details are not even chained for a traceback to show.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    assert cache_path(ctx, "local").read_bytes() == before


async def test_refresh_connection_refused_is_catalog_refresh_failed(
    ctx: LaunchContext, model_server: ModelServer
) -> None:
    local_provider(ctx, model_server.base + "/v1")
    model_server.routes.clear()
    # Port 9 (discard) on loopback is closed in the test environment.
    local_provider(ctx, "http://127.0.0.1:9/v1")
    async with httpx.AsyncClient() as client:
        with pytest.raises(ServiceError) as info:
            await refresh(ctx, load_settings(ctx), "local", client, {}, lambda: NOW)
    assert info.value.code is ErrorCode.CATALOG_REFRESH_FAILED


async def test_refresh_unknown_provider_is_invalid_selection(ctx: LaunchContext) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ServiceError) as info:
            await refresh(ctx, load_settings(ctx), "nope", client, {}, lambda: NOW)
    assert info.value.code is ErrorCode.INVALID_SELECTION


async def test_static_models_refresh_without_network(ctx: LaunchContext) -> None:
    local_provider(
        ctx,
        "http://127.0.0.1:9/v1",
        models=[{"id": "tiny", "label": "Tiny", "context_window": 512}, {"id": "tiny"}],
    )
    async with httpx.AsyncClient() as client:
        result = await refresh(ctx, load_settings(ctx), "local", client, {}, lambda: NOW)
    assert result["state"] == "fresh_cache"
    [entry] = models(ctx, "local")["entries"]
    assert (entry["model_id"], entry["label"], entry["context_window"]) == ("tiny", "Tiny", 512)
    # Editing the declared list is a configuration change: the old cache no longer matches.
    local_provider(ctx, "http://127.0.0.1:9/v1", models=[{"id": "other"}])
    assert models(ctx, "local")["state"] == "unavailable"
