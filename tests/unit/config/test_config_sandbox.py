"""The ``sandbox`` and ``sandbox_network`` settings: a project file can confine its
commands more than the global file says, never less (``docs/safety.md``)."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.config.schema import SETTINGS_SCHEMA, is_valid, project_schema
from magi_code.config.settings import build_settings


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
