"""Child slots: at most ``MAX_CHILDREN_PER_TURN`` per turn and ``max_children()`` in the
process; a tool past either limit gets the fixed error and starts nothing."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from magi_code.tools.base import ToolContext, run_tool
from magi_code.tools.files import Grep
from magi_code.tools.processes import (
    MAX_CHILDREN_ENV,
    MAX_CHILDREN_PER_TURN,
    ChildLimitReached,
    child_slot,
)
from magi_code.tools.shell import Shell

LIMIT_ERROR = (
    "Not started: too many processes are running (at most 16 for one turn and {total} in "
    "all); wait for some to finish, then try again."
)


def turn(tmp_path: Path) -> ToolContext:
    return ToolContext(project_dir=tmp_path, env={"PATH": os.environ.get("PATH", "/bin")})


def test_a_turn_holds_at_most_its_share_and_others_are_unaffected(tmp_path: Path) -> None:
    first, second = turn(tmp_path), turn(tmp_path)
    with contextlib.ExitStack() as held:
        for _ in range(MAX_CHILDREN_PER_TURN):
            held.enter_context(child_slot(first))
        with pytest.raises(ChildLimitReached) as refused, child_slot(first):
            pass
        assert str(refused.value) == LIMIT_ERROR.format(total=128)
        with child_slot(second), child_slot(None):
            pass
    with child_slot(first):  # released with the ``with`` blocks
        pass


def test_the_process_total_counts_every_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_CHILDREN_ENV, "2")
    with child_slot(None), child_slot(turn(tmp_path)):
        with pytest.raises(ChildLimitReached) as refused, child_slot(turn(tmp_path)):
            pass
        assert str(refused.value) == LIMIT_ERROR.format(total=2)
    with child_slot(None), child_slot(None):
        pass


async def test_shell_and_grep_past_the_limit_get_the_fixed_error_and_start_nothing(
    tmp_path: Path,
) -> None:
    ctx = turn(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / "a.txt").write_text("needle\n")
    with contextlib.ExitStack() as held:
        for _ in range(MAX_CHILDREN_PER_TURN):
            held.enter_context(child_slot(ctx))
        shell = await run_tool(Shell(), json.dumps({"command": f"touch {marker}"}), ctx)
        grep = await run_tool(Grep(), json.dumps({"pattern": "needle"}), ctx)
    for outcome in (shell, grep):
        assert outcome.is_error and outcome.output == LIMIT_ERROR.format(total=128)
    assert not marker.exists()
    after = await run_tool(Shell(), json.dumps({"command": f"touch {marker}"}), ctx)
    assert not after.is_error and marker.exists()
