"""The project's grants: the allow rules of its settings file, read and removed there.

"Allow always for this project" answers are written to the project settings'
``approval_rules.allow`` (they count only in a trusted project). The daemon's
``grants_list``/``grants_revoke`` and ``magi-code grants`` read and change them here, the
file itself, so they agree whether or not a daemon runs. Blocking (file I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from magi_code.config.approvals import Rules, remove_rule, rules
from magi_code.config.settings import (
    Scope,
    is_trusted,
    project_settings_path,
    read_document,
    update_settings,
)
from magi_code.protocol.errors import ServiceError
from magi_code.storage.launch import LaunchContext


def project_grants(ctx: LaunchContext) -> tuple[Rules, bool]:
    """The project file's allow rules, and whether they count (the project is trusted).
    A file that cannot be read has none."""
    path = project_settings_path(ctx)
    if path is None:
        return Rules(), False
    try:
        document = read_document(path, Scope.PROJECT)
        global_doc = read_document(ctx.global_settings_path, Scope.GLOBAL)
    except ServiceError:
        return Rules(), False
    trusted = is_trusted(global_doc.get("trusted_projects", ()), ctx.project_dir)
    return rules(document, "allow"), trusted


def revoke_project_grant(ctx: LaunchContext, kind: str, value: Sequence[str] | str) -> bool:
    """Remove one allow rule from the project file (through the one checked writer);
    whether it was there.

    Raises:
        ServiceError: the file cannot be read or written.
    """
    removed = False

    def mutate(_current: object, document: dict[str, Any]) -> None:
        nonlocal removed
        removed = remove_rule(document, "allow", kind, value)

    update_settings(ctx, Scope.PROJECT, mutate)
    return removed
