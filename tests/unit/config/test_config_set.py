"""``config.set``: validation rules, scoped persistence, unknown-field preservation,
project pins and cross-process writers (spec "Persist a scoped change")."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from config_helpers import NOW, read_json, seed_catalog, write_json

from magi_code.config.catalog import CatalogModel
from magi_code.config.effective import apply_config_set
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext

CLAUDE_A = CatalogModel("claude-a", "Claude A", reasoning_levels=("default", "high"))
CLAUDE_B = CatalogModel("claude-b", "Claude B")
CLAUDE_OFF = CatalogModel("claude-off", "Claude Off")


def set_config(ctx: LaunchContext, payload: Any, now: float = NOW) -> dict[str, Any]:
    return apply_config_set(ctx, payload, lambda: now)


def error_code(ctx: LaunchContext, payload: Any, now: float = NOW) -> ErrorCode:
    with pytest.raises(ServiceError) as info:
        set_config(ctx, payload, now)
    return info.value.code


@pytest.fixture
def catalog_ctx(ctx: LaunchContext) -> LaunchContext:
    write_json(ctx.global_settings_path, {"disabled_models": {"anthropic": ["claude-off"]}})
    seed_catalog(ctx, "anthropic", [CLAUDE_A, CLAUDE_B, CLAUDE_OFF])
    return ctx


SELECT_A = {"provider_id": "anthropic", "model_id": "claude-a"}


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (None, ErrorCode.INVALID_PAYLOAD),
        ([], ErrorCode.INVALID_PAYLOAD),
        ({}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global"}, ErrorCode.INVALID_PAYLOAD),
        ({"fast": True}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "fast": True, "extra": 1}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "fast": None}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": None, "fast": True}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": 1, "fast": True}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "fast": 1}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "fast": "true"}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "thinking_level": "extreme"}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "thinking_level": 3}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "thinking_level": None}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "selection": None}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "selection": "anthropic/claude-a"}, ErrorCode.INVALID_PAYLOAD),
        ({"scope": "global", "selection": {"provider_id": "anthropic"}}, ErrorCode.INVALID_PAYLOAD),
        (
            {"scope": "global", "selection": {"provider_id": "anthropic", "model_id": None}},
            ErrorCode.INVALID_PAYLOAD,
        ),
        (
            {"scope": "global", "selection": {**SELECT_A, "label": "x"}},
            ErrorCode.INVALID_PAYLOAD,
        ),
        (
            {"scope": "global", "selection": {"provider_id": "anthropic", "model_id": 7}},
            ErrorCode.INVALID_PAYLOAD,
        ),
        ({"scope": "user", "fast": True}, ErrorCode.INVALID_SCOPE),
        ({"scope": "session", "selection": SELECT_A}, ErrorCode.INVALID_SCOPE),
        ({"scope": "project", "fast": True}, ErrorCode.INVALID_SCOPE),
        ({"scope": "project", "fast": False}, ErrorCode.INVALID_SCOPE),
        ({"scope": "project", "fast": False, "thinking_level": "high"}, ErrorCode.INVALID_SCOPE),
        (
            {"scope": "global", "selection": {"provider_id": "nope", "model_id": "m"}},
            ErrorCode.INVALID_SELECTION,
        ),
        (
            {"scope": "global", "selection": {"provider_id": "anthropic", "model_id": "unknown"}},
            ErrorCode.INVALID_SELECTION,
        ),
        (
            {
                "scope": "global",
                "selection": {"provider_id": "anthropic", "model_id": "claude-off"},
            },
            ErrorCode.INVALID_SELECTION,
        ),
        (
            {"scope": "global", "selection": {"provider_id": "anthropic", "model_id": "bad id"}},
            ErrorCode.INVALID_SELECTION,
        ),
        (
            {
                "scope": "global",
                "selection": {"provider_id": "anthropic", "model_id": "sk-ant-api03-secret"},
            },
            ErrorCode.INVALID_SELECTION,
        ),
        (
            {"scope": "global", "selection": {"provider_id": "", "model_id": "claude-a"}},
            ErrorCode.INVALID_SELECTION,
        ),
        (
            {"scope": "project", "selection": SELECT_A, "thinking_level": "max"},
            ErrorCode.UNSUPPORTED_REASONING,
        ),
        (
            {
                "scope": "global",
                "selection": {"provider_id": "anthropic", "model_id": "claude-b"},
                "thinking_level": "x_high",
            },
            ErrorCode.UNSUPPORTED_REASONING,
        ),
        # Reasoning-only: the default selection (claude-sonnet-4-5) is not in the catalog.
        ({"scope": "global", "thinking_level": "high"}, ErrorCode.INVALID_SELECTION),
    ],
)
def test_config_set_rules(catalog_ctx: LaunchContext, payload: Any, code: ErrorCode) -> None:
    before = catalog_ctx.global_settings_path.read_bytes()
    assert error_code(catalog_ctx, payload) is code
    # A rejected request never touches either settings file.
    assert catalog_ctx.global_settings_path.read_bytes() == before
    assert not catalog_ctx.project_settings_path.exists()


def test_selection_needs_a_usable_and_fresh_catalog(ctx: LaunchContext) -> None:
    payload = {"scope": "global", "selection": SELECT_A}
    assert error_code(ctx, payload) is ErrorCode.CATALOG_UNAVAILABLE
    assert error_code(ctx, {"scope": "global", "thinking_level": "low"}) is (
        ErrorCode.CATALOG_UNAVAILABLE
    )
    seed_catalog(ctx, "anthropic", [CLAUDE_A])
    assert error_code(ctx, payload, now=NOW + 3600) is ErrorCode.CATALOG_STALE
    # A configuration change (endpoint override) makes the same cache unusable.
    moved = LaunchContext(
        ctx.mc_home, ctx.project_dir, {"ANTHROPIC_BASE_URL": "http://127.0.0.1:1"}
    )
    assert error_code(moved, payload) is ErrorCode.CATALOG_UNAVAILABLE
    assert set_config(ctx, payload)["persisted"] is True


def test_fast_only_write_needs_no_catalog(ctx: LaunchContext) -> None:
    result = set_config(ctx, {"scope": "global", "fast": True})
    assert result["persisted"] is True
    assert result["scope"] == "global"
    assert result["effective"]["fast"] is True
    assert read_json(ctx.global_settings_path) == {"fast": True}


def test_selection_persists_and_resets_reasoning(catalog_ctx: LaunchContext) -> None:
    ctx = catalog_ctx
    first = set_config(ctx, {"scope": "global", "selection": SELECT_A, "thinking_level": "high"})
    assert first["effective"]["selection"] == SELECT_A
    assert first["effective"]["thinking_level"] == "high"
    assert first["effective"]["available_thinking_levels"] == ["default", "high"]
    second = set_config(
        ctx,
        {"scope": "global", "selection": {"provider_id": "anthropic", "model_id": "claude-b"}},
    )
    assert second["effective"]["configured_thinking_level"] == "default"
    document = read_json(ctx.global_settings_path)
    assert (document["provider"], document["model"], document["thinking_level"]) == (
        "anthropic",
        "claude-b",
        "default",
    )


def test_reasoning_only_change_validates_effective_selection(
    catalog_ctx: LaunchContext,
) -> None:
    ctx = catalog_ctx
    set_config(ctx, {"scope": "global", "selection": SELECT_A})
    assert error_code(ctx, {"scope": "global", "thinking_level": "low"}) is (
        ErrorCode.UNSUPPORTED_REASONING
    )
    result = set_config(ctx, {"scope": "project", "thinking_level": "high"})
    assert result["effective"]["thinking_level"] == "high"
    assert read_json(ctx.project_settings_path) == {"thinking_level": "high"}
    # Under an environment override the override's model is what gets validated.
    env_ctx = LaunchContext(ctx.mc_home, ctx.project_dir, {"MC_MODEL": "claude-b"})
    assert set_config(env_ctx, {"scope": "global", "thinking_level": "medium"})["persisted"]
    assert error_code(env_ctx, {"scope": "global", "thinking_level": "x_high"}) is (
        ErrorCode.UNSUPPORTED_REASONING
    )


def test_environment_override_masks_successful_global_write(catalog_ctx: LaunchContext) -> None:
    env_ctx = LaunchContext(
        catalog_ctx.mc_home, catalog_ctx.project_dir, {"MC_MODEL": "claude-env-only"}
    )
    result = set_config(env_ctx, {"scope": "global", "selection": SELECT_A})
    assert result["persisted"] is True
    assert result["effective"]["selection"]["model_id"] == "claude-env-only"
    assert read_json(catalog_ctx.global_settings_path)["model"] == "claude-a"


def test_project_writes_pin_values_equal_to_inherited_ones(catalog_ctx: LaunchContext) -> None:
    ctx = catalog_ctx
    set_config(ctx, {"scope": "global", "selection": SELECT_A, "thinking_level": "high"})
    set_config(ctx, {"scope": "project", "selection": SELECT_A, "thinking_level": "high"})
    assert read_json(ctx.project_settings_path) == {
        "provider": "anthropic",
        "model": "claude-a",
        "thinking_level": "high",
    }
    # The pin holds after the global choice moves on.
    moved = set_config(
        ctx,
        {"scope": "global", "selection": {"provider_id": "anthropic", "model_id": "claude-b"}},
    )
    assert moved["effective"]["selection"] == SELECT_A
    assert moved["effective"]["thinking_level"] == "high"


def test_unknown_fields_survive_every_write(catalog_ctx: LaunchContext) -> None:
    ctx = catalog_ctx
    extra_global = {
        "theme": {"name": "dark", "sizes": [1, 2, 3]},
        "disabled_models": {"anthropic": ["claude-off"]},
        "providers": {
            "local": {"api": "openai-chat", "base_url": "http://127.0.0.1:9/v1", "custom": [True]}
        },
        "mcp_servers": {"s": {"command": "c", "future": {"x": None}}},
    }
    write_json(ctx.global_settings_path, extra_global)
    write_json(ctx.project_settings_path, {"editor": "vim", "model": "claude-b"})
    set_config(ctx, {"scope": "global", "fast": True})
    set_config(ctx, {"scope": "global", "selection": SELECT_A})
    set_config(ctx, {"scope": "project", "thinking_level": "default"})
    assert read_json(ctx.global_settings_path) == {
        **extra_global,
        "fast": True,
        "provider": "anthropic",
        "model": "claude-a",
        "thinking_level": "default",
    }
    assert read_json(ctx.project_settings_path) == {
        "editor": "vim",
        "model": "claude-b",
        "thinking_level": "default",
    }


def test_settings_file_is_private_and_symlink_is_replaced(
    ctx: LaunchContext, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"keep": true}')
    ctx.global_settings_path.parent.mkdir(parents=True, exist_ok=True)
    ctx.global_settings_path.symlink_to(target)
    set_config(ctx, {"scope": "global", "fast": True})
    assert not ctx.global_settings_path.is_symlink()
    assert stat.S_IMODE(ctx.global_settings_path.stat().st_mode) == 0o600
    assert read_json(ctx.global_settings_path) == {"keep": True, "fast": True}
    assert read_json(target) == {"keep": True}


def test_invalid_existing_settings_block_writes(ctx: LaunchContext) -> None:
    ctx.global_settings_path.parent.mkdir(parents=True, exist_ok=True)
    ctx.global_settings_path.write_text("{not json")
    assert error_code(ctx, {"scope": "global", "fast": True}) is (
        ErrorCode.CONFIGURATION_UNAVAILABLE
    )
    assert ctx.global_settings_path.read_text() == "{not json"


def test_lock_failure_is_settings_write_failed(ctx: LaunchContext) -> None:
    write_json(ctx.global_settings_path, {"keep": 1})
    # The lock file cannot be opened when a directory sits at its path.
    Path(str(ctx.global_settings_path) + ".lock").mkdir()
    assert error_code(ctx, {"scope": "global", "fast": True}) is ErrorCode.SETTINGS_WRITE_FAILED
    assert read_json(ctx.global_settings_path) == {"keep": 1}


def test_oversized_result_is_settings_write_failed(ctx: LaunchContext) -> None:
    # Compact input just under the read bound grows past it once re-encoded with indentation.
    ctx.global_settings_path.parent.mkdir(parents=True, exist_ok=True)
    ctx.global_settings_path.write_bytes(b'{"pad":[' + b"0," * 400_000 + b"0]}")
    before = ctx.global_settings_path.read_bytes()
    assert error_code(ctx, {"scope": "global", "fast": True}) is ErrorCode.SETTINGS_WRITE_FAILED
    assert ctx.global_settings_path.read_bytes() == before


def test_unusable_project_directory_is_configuration_unavailable(ctx: LaunchContext) -> None:
    (ctx.project_dir / ".magi-code").write_text("")
    assert error_code(ctx, {"scope": "global", "fast": True}) is (
        ErrorCode.CONFIGURATION_UNAVAILABLE
    )


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from magi_code.config.effective import apply_config_set
    from magi_code.config.settings import Scope, update_settings
    from magi_code.storage.launch import LaunchContext

    home, project, role, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ctx = LaunchContext(Path(home), Path(project), {})

    def bump(_settings, document):
        document[role + "_count"] = document.get(role + "_count", 0) + 1

    for i in range(rounds):
        if role == "fast":
            payload = {"scope": "global", "fast": i % 2 == 1}
        else:
            payload = {"scope": "global", "thinking_level": "low" if i % 2 else "high"}
        apply_config_set(ctx, payload)
        update_settings(ctx, Scope.GLOBAL, bump)
    """
)


def test_concurrent_writer_processes_lose_nothing(ctx: LaunchContext) -> None:
    """Two processes write different fields in a loop through the locked writer; the file
    is always complete JSON and every read-modify-write survives."""
    import time

    write_json(ctx.global_settings_path, {"keep": "me"})
    seed_catalog(
        ctx,
        "anthropic",
        [CatalogModel("claude-sonnet-4-5", "S", reasoning_levels=("default", "low", "high"))],
        fetched_at=time.time(),
    )
    rounds = 25
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(ctx.mc_home),
                str(ctx.project_dir),
                role,
                str(rounds),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for role in ("fast", "level")
    ]
    try:
        while any(p.poll() is None for p in procs):
            # Every observable state is a whole document (atomic replace).
            assert isinstance(json.loads(ctx.global_settings_path.read_bytes()), dict)
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err.decode()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    document = read_json(ctx.global_settings_path)
    assert document["keep"] == "me"
    assert document["fast_count"] == rounds
    assert document["level_count"] == rounds
    assert document["fast"] is False  # last round (24) wrote i % 2 == 1 -> False
    assert document["thinking_level"] == "high"
