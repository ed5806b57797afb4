"""The shell tool: output, exit status, timeout and cancellation kill the whole process
group, and children never see the service's socket or credentials (issue: built-in tools).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from magi_code.tools.base import ToolContext, ToolOutcome, run_tool
from magi_code.tools.shell import Shell


def live_members(pgid: int) -> list[psutil.Process]:
    """Processes of group ``pgid`` that are not zombies (PID 1 here may not reap)."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(project_dir=tmp_path, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


async def shell(ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(Shell(), json.dumps(arguments), ctx)


async def test_shell_runs_in_the_project_and_reports_exit_code(ctx: ToolContext) -> None:
    outcome = await shell(ctx, command="pwd; echo err >&2")
    assert outcome.output == f"{ctx.project_dir.resolve()}\nerr\n[exit code 0]"
    assert not outcome.is_error
    assert outcome.timed_out is False


async def test_shell_nonzero_exit_is_an_error_result(ctx: ToolContext) -> None:
    outcome = await shell(ctx, command="echo partial; exit 7")
    assert outcome.output == "partial\n[exit code 7]"
    assert outcome.is_error
    assert outcome.timed_out is False


async def test_shell_output_is_bounded_keeping_head_and_tail(ctx: ToolContext) -> None:
    command = f"{sys.executable} -c \"print('A' * 100000 + 'END')\""
    outcome = await shell(ctx, command=command)
    assert len(outcome.output.encode()) <= 32 * 1024
    assert outcome.output.startswith("AAAA")
    assert "bytes omitted]" in outcome.output
    assert outcome.output.endswith("END\n[exit code 0]")


async def test_shell_timeout_kills_the_whole_process_group(ctx: ToolContext) -> None:
    # The grandchild `sleep` would outlive a kill of the shell alone.
    command = 'echo "pgid=$$"; sh -c "sleep 300" & sleep 300'
    outcome = await shell(ctx, command=command, timeout_seconds=0.5)
    assert outcome.is_error
    assert outcome.timed_out is True
    assert "[timed out after 0.5 s" in outcome.output
    pgid = int(outcome.output.split("pgid=")[1].split("\n")[0])
    assert live_members(pgid) == []


async def test_cancelled_shell_leaves_no_process_behind(ctx: ToolContext) -> None:
    marker = ctx.project_dir / "pgid.txt"
    command = 'echo $$ > pgid.tmp && mv pgid.tmp pgid.txt; sh -c "sleep 300" & sleep 300'
    task = asyncio.create_task(shell(ctx, command=command))
    async with asyncio.timeout(10):
        while not marker.exists():
            await asyncio.sleep(0.02)
        pgid = int(marker.read_text())
        # Wait until the grandchild exists, so the cancel has a tree to kill.
        while sum(proc.name() == "sleep" for proc in live_members(pgid)) < 2:
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert live_members(pgid) == []


async def test_background_jobs_end_with_the_command(ctx: ToolContext) -> None:
    outcome = await shell(ctx, command='echo "pgid=$$"; sleep 300 > /dev/null 2>&1 &')
    assert outcome.output.endswith("[exit code 0]")
    pgid = int(outcome.output.split("pgid=")[1].split("\n")[0])
    assert live_members(pgid) == []


async def test_shell_children_do_not_inherit_service_variables(tmp_path: Path) -> None:
    ctx = ToolContext(
        project_dir=tmp_path,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MC_DAEMON_SOCKET": "/run/mc/daemon.sock",
            "MC_RUNTIME_DIR": "/run/mc",
            "MC_HOME": "/home/u/.magi-code",
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "OPENAI_API_KEY": "sk-oai-test",
            "CUSTOM_PROVIDER_KEY": "custom-secret",
            "KEEP_ME": "kept",
        },
        secret_names=frozenset({"CUSTOM_PROVIDER_KEY"}),
    )
    outcome = await shell(ctx, command="env")
    names = {line.split("=", 1)[0] for line in outcome.output.split("\n") if "=" in line}
    assert "KEEP_ME" in names
    assert "PATH" in names
    for stripped in (
        "MC_DAEMON_SOCKET",
        "MC_RUNTIME_DIR",
        "MC_HOME",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "CUSTOM_PROVIDER_KEY",
    ):
        assert stripped not in names
    assert "secret" not in outcome.output and "sk-" not in outcome.output


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"command": ""},
        {"command": "true", "timeout_seconds": 0},
        {"command": "true", "timeout_seconds": 601},
        {"command": "true", "timeout_seconds": "5"},
    ],
)
async def test_shell_rejects_invalid_arguments(
    ctx: ToolContext, arguments: dict[str, object]
) -> None:
    outcome = await run_tool(Shell(), json.dumps(arguments), ctx)
    assert outcome.is_error
    assert outcome.timed_out is None


async def test_shell_reports_a_missing_project_directory(tmp_path: Path) -> None:
    ctx = ToolContext(project_dir=tmp_path / "gone", env={})
    outcome = await shell(ctx, command="true")
    assert outcome.is_error
    assert str(tmp_path) not in outcome.output


async def test_shell_children_get_the_launch_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a daemon this process's environment is the daemon's own: none of it may leak.
    monkeypatch.setenv("SERVICE_OWN_SECRET", "sk-service-own-0000")
    launch = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KEEP_ME": "kept"}
    outcome = await shell(ToolContext(project_dir=tmp_path, env=launch), command="env")
    lines = outcome.output.split("\n")
    names = {line.split("=", 1)[0] for line in lines if "=" in line}
    # /bin/sh may export PWD, SHLVL and _ itself; nothing else but the launch variables.
    assert names - {"PWD", "OLDPWD", "SHLVL", "_"} == set(launch)
    assert "sk-service-own" not in outcome.output
