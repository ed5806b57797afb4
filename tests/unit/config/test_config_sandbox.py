"""The ``sandbox`` and ``sandbox_network`` settings: a project file can confine its
commands more than the global file says, never less (``docs/safety.md``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from magi_code.config.effective import effective_config
from magi_code.config.schema import SANDBOX_LEVELS, SETTINGS_SCHEMA, is_valid, project_schema
from magi_code.config.settings import build_settings, load_settings
from magi_code.protocol.schema import definitions
from magi_code.storage.launch import LaunchContext
from magi_code.tools.sandbox import BWRAP_ENV


@pytest.mark.parametrize(
    ("global_doc", "project_doc", "level", "network"),
    [
        ({}, {}, "none", False),
        ({"sandbox": "workspace_write"}, {}, "workspace_write", False),
        # Raised by the project, trusted or not; never lowered by it.
        ({}, {"sandbox": "workspace_write"}, "workspace_write", False),
        ({"sandbox": "workspace_write"}, {"sandbox": "none"}, "workspace_write", False),
        # The network: only the global file allows it, and a project can turn it off.
        ({"sandbox_network": True}, {}, "none", True),
        ({"sandbox_network": True}, {"sandbox_network": False}, "none", False),
        ({}, {"sandbox_network": True}, "none", False),
    ],
)
def test_a_project_only_tightens_the_sandbox(
    global_doc: dict[str, Any], project_doc: dict[str, Any], level: str, network: bool
) -> None:
    for trusted in (False, True):
        settings = build_settings(global_doc, project_doc, trusted=trusted)
        assert (settings.sandbox, settings.sandbox_network) == (level, network)
        assert settings.ignored_project_keys == ()  # nothing to ignore: it only tightens


@pytest.mark.parametrize("schema", [SETTINGS_SCHEMA, project_schema()])
def test_both_files_validate_the_sandbox_keys(schema: dict[str, Any]) -> None:
    assert is_valid({"sandbox": "workspace_write", "sandbox_network": False}, schema)
    assert is_valid({"sandbox": "none", "sandbox_network": True}, schema)
    assert not is_valid({"sandbox": "read_only"}, schema)
    assert not is_valid({"sandbox": True}, schema)
    assert not is_valid({"sandbox_network": "yes"}, schema)


def test_config_get_says_which_sandbox_a_turn_here_gets(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    (project / ".magi-code").mkdir(parents=True)
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"sandbox_network": True}))
    (project / ".magi-code" / "settings.json").write_text('{"sandbox": "workspace_write"}')
    ctx = LaunchContext(home, project, {}, None)
    # Without a usable bwrap: the level is still reported, and that it cannot start.
    os.environ[BWRAP_ENV] = "/bin/false"
    try:
        shown = effective_config(ctx, load_settings(ctx))["sandbox"]
    finally:
        del os.environ[BWRAP_ENV]
    assert shown == {
        "level": "workspace_write",
        "network": True,
        "workspace_write_available": False,
    }


def test_the_wire_schema_knows_the_settings_levels() -> None:
    assert definitions.SANDBOX_LEVELS == SANDBOX_LEVELS
