"""Spawners record what each live child is (``daemon status``'s ``children``), and forget
it once the child is reaped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from magi_code.tools.base import ToolContext, run_tool
from magi_code.tools.files import Grep
from magi_code.tools.processes import child_kind
from magi_code.tools.shell import run_shell


def kinds() -> list[str | None]:
    return [child_kind(child.pid) for child in psutil.Process().children(recursive=False)]


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):  # a failure bound, not a timing assertion
        while not predicate():
            await asyncio.sleep(0.02)


async def test_a_hook_shell_is_recorded_as_a_hook_while_it_runs(tmp_path: Path) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    command = f"touch {started}; while [ ! -e {release} ]; do sleep 0.02; done"
    run = asyncio.create_task(run_shell(command, cwd=tmp_path, env={}, timeout=60, kind="hook"))
    await until(started.exists)
    # Recorded as its spawn returns, which may be just after the shell already ran a line.
    await until(lambda: kinds() == ["hook"])
    pid = psutil.Process().children()[0].pid
    release.touch()
    assert (await run).returncode == 0
    assert child_kind(pid) is None


async def test_a_grep_worker_is_recorded_as_a_worker_until_it_is_reaped(tmp_path: Path) -> None:
    (tmp_path / "evil.txt").write_text("a" * 64 + "b\n")
    ctx = ToolContext(project_dir=tmp_path, env={})
    search = asyncio.create_task(
        run_tool(Grep(), json.dumps({"pattern": r"(a+)+$", "path": "evil.txt"}), ctx)
    )
    await until(lambda: kinds() == ["worker"])
    pid = psutil.Process().children()[0].pid
    search.cancel()
    with pytest.raises(asyncio.CancelledError):
        await search
    assert child_kind(pid) is None and kinds() == []
