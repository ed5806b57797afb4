"""Settings files: validated reads, merge/precedence, the generated schema (spec
"Read effective settings"; architecture "Pinned interfaces")."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_helpers import NOW, read_json, seed_catalog, write_json

from magi_code.config.catalog import CatalogModel
from magi_code.config.effective import apply_config_set, effective_config, resolve_effective
from magi_code.config.schema import (
    SCHEMA_FILENAME,
    SETTINGS_SCHEMA,
    is_valid,
    write_settings_schema,
)
from magi_code.config.settings import (
    MAX_SETTINGS_BYTES,
    all_providers,
    builtin_providers,
    load_settings,
)
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext
from magi_code.tools.sandbox import bubblewrap


def config_get(ctx: LaunchContext, now: float = NOW) -> dict[str, Any]:
    return effective_config(ctx, load_settings(ctx), lambda: now)


def test_missing_files_give_documented_defaults(ctx: LaunchContext) -> None:
    assert config_get(ctx) == {
        "selection": {"provider_id": "anthropic", "model_id": "claude-sonnet-4-5"},
        "thinking_level": "default",
        "configured_thinking_level": "default",
        "available_thinking_levels": ["default", "low", "medium", "high", "max"],
        "fast": False,
        "precedence": ["environment", "project", "global"],
        "writable_scopes": ["global", "project"],
        "global_only": ["fast"],
        "sandbox": {
            "level": "none",
            "network": False,
            "workspace_write_available": bubblewrap().path is not None,
        },
    }


def test_codex_default_model_and_fallback_levels(ctx: LaunchContext) -> None:
    write_json(ctx.global_settings_path, {"provider": "openai-codex"})
    payload = config_get(ctx)
    assert payload["selection"] == {"provider_id": "openai-codex", "model_id": "gpt-5.1-codex"}
    assert payload["available_thinking_levels"] == ["default", "low", "medium", "high", "x_high"]


def test_project_overrides_global_and_environment_overrides_both(
    make_ctx: Callable[..., LaunchContext],
) -> None:
    ctx = make_ctx()
    write_json(
        ctx.global_settings_path,
        {"provider": "anthropic", "model": "claude-global", "thinking_level": "low", "fast": True},
    )
    write_json(ctx.project_settings_path, {"model": "claude-project", "thinking_level": "high"})
    payload = config_get(ctx)
    assert payload["selection"] == {"provider_id": "anthropic", "model_id": "claude-project"}
    assert payload["configured_thinking_level"] == "high"
    assert payload["thinking_level"] == "high"
    assert payload["fast"] is True

    env_ctx = make_ctx(MC_MODEL="claude-env")
    assert config_get(env_ctx)["selection"]["model_id"] == "claude-env"
    both = make_ctx(MC_PROVIDER="openai-codex", MC_MODEL="gpt-env")
    assert config_get(both)["selection"] == {"provider_id": "openai-codex", "model_id": "gpt-env"}


def test_switching_provider_in_higher_layer_drops_lower_layers_model(
    make_ctx: Callable[..., LaunchContext],
) -> None:
    ctx = make_ctx()
    write_json(ctx.global_settings_path, {"provider": "anthropic", "model": "claude-x"})
    write_json(ctx.project_settings_path, {"provider": "openai-codex"})
    assert config_get(ctx)["selection"] == {
        "provider_id": "openai-codex",
        "model_id": "gpt-5.1-codex",
    }
    env_ctx = make_ctx(MC_PROVIDER="anthropic")
    assert config_get(env_ctx)["selection"]["model_id"] == "claude-sonnet-4-5"
    # Naming the same provider again keeps the lower layer's model.
    write_json(ctx.project_settings_path, {"provider": "anthropic"})
    assert config_get(ctx)["selection"]["model_id"] == "claude-x"


def test_unsupported_configured_level_resolves_to_default(ctx: LaunchContext) -> None:
    write_json(ctx.global_settings_path, {"provider": "openai-codex", "thinking_level": "max"})
    payload = config_get(ctx)
    assert payload["configured_thinking_level"] == "max"
    assert payload["thinking_level"] == "default"


def test_fresh_catalog_levels_inform_config_get(ctx: LaunchContext) -> None:
    write_json(ctx.global_settings_path, {"thinking_level": "high"})
    seed_catalog(
        ctx,
        "anthropic",
        [CatalogModel("claude-sonnet-4-5", "Sonnet", reasoning_levels=("default", "low"))],
    )
    payload = config_get(ctx)
    assert payload["available_thinking_levels"] == ["default", "low"]
    assert payload["thinking_level"] == "default"
    # Once the cache is stale the provider fallback list applies again.
    stale = config_get(ctx, now=NOW + 7200)
    assert stale["available_thinking_levels"] == ["default", "low", "medium", "high", "max"]
    assert stale["thinking_level"] == "high"


def test_custom_provider_defaults_to_first_cached_model(ctx: LaunchContext) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "provider": "local",
            "providers": {"local": {"api": "openai-chat", "base_url": "http://127.0.0.1:9/v1"}},
        },
    )
    assert config_get(ctx)["selection"]["model_id"] == "default"
    assert config_get(ctx)["available_thinking_levels"] == ["default"]
    seed_catalog(ctx, "local", [CatalogModel("qwen3:8b", "Qwen"), CatalogModel("llama3", "L")])
    assert config_get(ctx)["selection"]["model_id"] == "qwen3:8b"


def test_unknown_fields_are_accepted_on_read(ctx: LaunchContext) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "theme": "dark",
            "providers": {"x": {"api": "anthropic", "base_url": "https://x", "extra": 1}},
        },
    )
    assert "x" in load_settings(ctx).providers


INVALID_GLOBAL_DOCUMENTS: list[Any] = [
    [],
    "settings",
    {"provider": 3},
    {"provider": ""},
    {"provider": "bad id"},
    {"model": "x" * 257},
    {"model": "sk-ant-api03-abcdef"},
    {"thinking_level": "extreme"},
    {"fast": "yes"},
    {"fast": 1},
    {"providers": {"anthropic": {"api": "anthropic", "base_url": "https://x"}}},
    {"providers": {"x": {"api": "grpc", "base_url": "https://x"}}},
    {"providers": {"x": {"api": "openai-chat"}}},
    {"providers": {"x": {"api": "openai-chat", "base_url": "ftp://x"}}},
    {"providers": {"x": {"api": "openai-chat", "base_url": "https://x", "context_window": True}}},
    {"providers": {"x": {"api": "openai-chat", "base_url": "https://x", "context_window": 0}}},
    {"providers": {"x": {"api": "openai-chat", "base_url": "https://x", "api_key_env": "A B"}}},
    {"mcp_servers": {"srv": {"args": []}}},
    {"mcp_servers": {"srv": {"command": "x", "args": [1]}}},
    {"mcp_servers": {"srv": {"command": "x", "env": {"K": 1}}}},
    {"disabled_models": {"anthropic": "claude"}},
]


@pytest.mark.parametrize("document", INVALID_GLOBAL_DOCUMENTS)
def test_invalid_global_documents_are_configuration_unavailable(
    ctx: LaunchContext, document: Any
) -> None:
    write_json(ctx.global_settings_path, document)
    with pytest.raises(ServiceError) as info:
        load_settings(ctx)
    assert info.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE


@pytest.mark.parametrize(
    "document",
    [
        {"fast": False},
        {"providers": {}},
        {"thinking_level": "loud"},
    ],
)
def test_project_file_rejects_global_only_keys_and_invalid_values(
    ctx: LaunchContext, document: Any
) -> None:
    write_json(ctx.project_settings_path, document)
    with pytest.raises(ServiceError) as info:
        load_settings(ctx)
    assert info.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"\xff\xfe{}", b'{"a": NaN}', b"{} {}"],
)
def test_unparseable_files_are_configuration_unavailable(ctx: LaunchContext, raw: bytes) -> None:
    ctx.global_settings_path.parent.mkdir(parents=True, exist_ok=True)
    ctx.global_settings_path.write_bytes(raw)
    with pytest.raises(ServiceError) as info:
        load_settings(ctx)
    assert info.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE


def test_oversized_and_non_regular_files_are_refused(ctx: LaunchContext) -> None:
    path = ctx.global_settings_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"pad": "' + b"x" * MAX_SETTINGS_BYTES + b'"}')
    with pytest.raises(ServiceError):
        load_settings(ctx)
    path.unlink()
    os.mkfifo(path)  # opening must not block on a FIFO
    with pytest.raises(ServiceError) as info:
        load_settings(ctx)
    assert info.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE


def test_unsafe_environment_selection_is_configuration_unavailable(
    make_ctx: Callable[..., LaunchContext],
) -> None:
    with pytest.raises(ServiceError) as info:
        config_get(make_ctx(MC_MODEL="sk-proj-abcdefghijklmnop"))
    assert info.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE
    # An empty variable means unset.
    assert config_get(make_ctx(MC_MODEL=""))["selection"]["model_id"] == "claude-sonnet-4-5"


def test_builtin_endpoints_follow_environment_overrides(
    make_ctx: Callable[..., LaunchContext],
) -> None:
    defaults = builtin_providers(make_ctx())
    assert defaults["anthropic"].base_url == "https://api.anthropic.com"
    assert defaults["openai-codex"].base_url == "https://chatgpt.com/backend-api/codex"
    overridden = builtin_providers(
        make_ctx(ANTHROPIC_BASE_URL="http://127.0.0.1:1", MC_CODEX_BASE_URL="http://127.0.0.1:2")
    )
    assert overridden["anthropic"].base_url == "http://127.0.0.1:1"
    assert overridden["openai-codex"].api == "openai-responses"
    assert overridden["openai-codex"].base_url == "http://127.0.0.1:2"


def test_custom_providers_are_merged_sorted(ctx: LaunchContext) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "providers": {
                "zeta": {"api": "openai-chat", "base_url": "http://127.0.0.1:1/v1"},
                "alpha": {
                    "api": "anthropic",
                    "base_url": "http://127.0.0.1:2",
                    "api_key_env": "ALPHA_KEY",
                    "context_window": 4096,
                    "label": "Alpha",
                },
            }
        },
    )
    providers = all_providers(ctx, load_settings(ctx))
    assert list(providers) == ["alpha", "anthropic", "openai-codex", "zeta"]
    alpha = providers["alpha"]
    assert (alpha.api, alpha.api_key_env, alpha.context_window, alpha.credential) == (
        "anthropic",
        "ALPHA_KEY",
        4096,
        "env",
    )
    assert providers["zeta"].api_key_env is None
    assert providers["zeta"].credential == "none"


@pytest.mark.parametrize("trusted", [True, False])
def test_mcp_servers_merge_with_a_trusted_projects_entries_winning(
    ctx: LaunchContext, trusted: bool
) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "mcp_servers": {
                "shared": {"command": "global-cmd"},
                "only-global": {"command": "g", "args": ["-v"], "env": {"TOKEN": "t"}},
            },
            "trusted_projects": [str(ctx.project_dir)] if trusted else [],
        },
    )
    project = {"shared": {"command": "project-cmd"}, "only-project": {"command": "p"}}
    write_json(ctx.project_settings_path, {"mcp_servers": project})
    servers = load_settings(ctx).mcp_servers
    # An untrusted project's servers are ignored: a cloned repository names no command.
    assert set(servers) == {"shared", "only-global", *(["only-project"] if trusted else [])}
    assert servers["shared"].command == ("project-cmd" if trusted else "global-cmd")
    assert servers["shared"].args == ()
    assert servers["only-global"].args == ("-v",)
    assert dict(servers["only-global"].env) == {"TOKEN": "t"}


def test_context_window_falls_back_to_provider_definition(ctx: LaunchContext) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "provider": "local",
            "model": "tiny",
            "providers": {
                "local": {
                    "api": "openai-chat",
                    "base_url": "http://127.0.0.1:9/v1",
                    "context_window": 2048,
                }
            },
        },
    )
    assert resolve_effective(ctx, load_settings(ctx), lambda: NOW).context_window == 2048
    seed_catalog(ctx, "local", [CatalogModel("tiny", "Tiny", context_window=512)])
    assert resolve_effective(ctx, load_settings(ctx), lambda: NOW).context_window == 512


def test_schema_file_is_written_once_and_matches_the_validator(ctx: LaunchContext) -> None:
    write_settings_schema(ctx)
    path = ctx.mc_home / SCHEMA_FILENAME
    assert read_json(path) == json.loads(json.dumps(SETTINGS_SCHEMA))
    before = path.stat()
    write_settings_schema(ctx)
    after = path.stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    path.write_text("{}")
    write_settings_schema(ctx)
    assert read_json(path) == json.loads(json.dumps(SETTINGS_SCHEMA))


@pytest.mark.parametrize(
    "document",
    [
        {},
        {"provider": "anthropic", "model": "claude-x", "thinking_level": "x_high", "fast": True},
        {"unknown": {"deep": [1, 2]}},
        {
            "providers": {
                "local": {"api": "openai-chat", "base_url": "http://h/v1", "models": [{"id": "m"}]}
            }
        },
        {"mcp_servers": {"s": {"command": "c", "args": ["a"], "env": {"K": "v"}}}},
        # Secret-looking IDs are a runtime rule on top of the schema.
        *(d for d in INVALID_GLOBAL_DOCUMENTS[2:] if d != {"model": "sk-ant-api03-abcdef"}),
    ],
)
def test_generated_schema_agrees_with_reference_json_schema_validator(document: Any) -> None:
    """The written schema is real JSON Schema: a reference validator gives the same verdict."""
    jsonschema = pytest.importorskip("jsonschema")
    reference = jsonschema.Draft202012Validator(SETTINGS_SCHEMA).is_valid(document)
    assert is_valid(document, SETTINGS_SCHEMA) == reference


def test_a_magi_code_symlink_is_followed_only_inside_the_project(
    ctx: LaunchContext, tmp_path: Path
) -> None:
    write_json(ctx.global_settings_path, {"model": "global-model"})
    inside = ctx.project_dir / "config"
    write_json(inside / "settings.json", {"model": "inside-model"})
    (ctx.project_dir / ".magi-code").symlink_to(inside)
    assert config_get(ctx)["selection"]["model_id"] == "inside-model"
    outside = tmp_path / "elsewhere"
    write_json(outside / "settings.json", {"model": "outside-model"})
    (ctx.project_dir / ".magi-code").unlink()
    (ctx.project_dir / ".magi-code").symlink_to(outside)
    assert config_get(ctx)["selection"]["model_id"] == "global-model"
    with pytest.raises(ServiceError) as refused:
        apply_config_set(ctx, {"scope": "project", "thinking_level": "high"})
    assert refused.value.code is ErrorCode.SETTINGS_WRITE_FAILED
    assert sorted(p.name for p in outside.iterdir()) == ["settings.json"]  # no lock file
