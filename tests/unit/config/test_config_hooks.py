"""The settings' ``hooks`` and ``trusted_projects``: parsed per file, validated like every
known key, ``trusted_projects`` global-only, and which hooks a turn in a project runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_helpers import write_json

from magi_code.config.schema import SETTINGS_SCHEMA, is_valid, project_schema
from magi_code.config.settings import (
    DEFAULT_HOOK_TIMEOUT_MS,
    HookDefinition,
    is_trusted,
    load_settings,
)
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext
from magi_code.turns.hooks import active_hooks


def test_hooks_are_read_from_each_file_apart(ctx: LaunchContext) -> None:
    write_json(
        ctx.global_settings_path,
        {
            "hooks": {
                "pre_tool_use": [
                    {"matcher": "shell", "command": ["/bin/check", "-q"], "timeout_ms": 500}
                ],
                "stop": [{"command": ["notify"]}],
                "unknown_event": [{"anything": True}],
            },
            "trusted_projects": [str(ctx.project_dir)],
        },
    )
    write_json(ctx.project_settings_path, {"hooks": {"stop": [{"command": ["project-stop"]}]}})
    settings = load_settings(ctx)
    assert settings.global_hooks == {
        "pre_tool_use": (HookDefinition(("/bin/check", "-q"), "shell", 500),),
        "stop": (HookDefinition(("notify",), "*", DEFAULT_HOOK_TIMEOUT_MS),),
    }
    assert settings.project_hooks == {"stop": (HookDefinition(("project-stop",)),)}
    assert settings.trusted_projects == (str(ctx.project_dir),)


@pytest.mark.parametrize(
    "hooks",
    [
        {"stop": [{"command": []}]},
        {"stop": [{"matcher": "*"}]},
        {"stop": [{"command": ["a\u0000b"]}]},
        {"stop": [{"command": ["x"], "timeout_ms": 0}]},
        {"stop": [{"command": ["x"], "timeout_ms": 600_001}]},
        {"pre_tool_use": [{"command": ["x"], "matcher": ""}]},
        {"pre_tool_use": {"command": ["x"]}},
        {"stop": [{"command": ["x"]}] * 33},
    ],
)
def test_invalid_hooks_are_refused(hooks: dict[str, Any]) -> None:
    assert not is_valid({"hooks": hooks}, SETTINGS_SCHEMA)


def test_trusted_projects_is_global_only(ctx: LaunchContext) -> None:
    document = {"trusted_projects": ["/src/one"]}
    assert is_valid(document, SETTINGS_SCHEMA)
    assert not is_valid(document, project_schema())
    assert not is_valid({"trusted_projects": ["relative/path"]}, SETTINGS_SCHEMA)
    write_json(ctx.project_settings_path, document)
    with pytest.raises(ServiceError) as caught:
        load_settings(ctx)
    assert caught.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE


def test_project_hooks_run_only_in_a_trusted_project(ctx: LaunchContext, tmp_path: Path) -> None:
    write_json(ctx.project_settings_path, {"hooks": {"stop": [{"command": ["project"]}]}})
    write_json(ctx.global_settings_path, {"hooks": {"stop": [{"command": ["global"]}]}})
    commands = [h.command for h in active_hooks(load_settings(ctx))["stop"]]
    assert commands == [("global",)]
    # Listed through a symlink: both sides are resolved. Global hooks come first.
    link = tmp_path / "project-link"
    link.symlink_to(ctx.project_dir)
    write_json(
        ctx.global_settings_path,
        {"hooks": {"stop": [{"command": ["global"]}]}, "trusted_projects": [str(link)]},
    )
    commands = [h.command for h in active_hooks(load_settings(ctx))["stop"]]
    assert commands == [("global",), ("project",)]
    # A subdirectory of a trusted project is not trusted.
    assert not is_trusted([str(ctx.project_dir)], ctx.project_dir / "sub")
