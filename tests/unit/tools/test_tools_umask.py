"""Tool children and new project files use the client's umask, not the service process's
(issue #13: the daemon runs under 077, its clients' users usually under 022).

Each test runs this process under a known mask (022) and gives the tool context another
one, so a tool that used the process's own mask fails.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from magi_code.storage.launch import current_umask
from magi_code.tools import mcp
from magi_code.tools.base import Tool, ToolContext, ToolOutcome, run_tool
from magi_code.tools.files import EditFile, WriteFile
from magi_code.tools.mcp import McpServerSpec, McpToolset
from magi_code.tools.processes import under_umask
from magi_code.tools.shell import Shell

PROCESS_UMASK = 0o022
SERVER_SCRIPT = str(Path(__file__).with_name("mcp_echo_server.py").resolve())


@pytest.fixture(autouse=True)
def process_umask() -> Iterator[int]:
    old = os.umask(PROCESS_UMASK)
    try:
        yield PROCESS_UMASK
    finally:
        os.umask(old)


def context(project: Path, umask: int | None) -> ToolContext:
    return ToolContext(
        project_dir=project, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, umask=umask
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def call(tool: Tool, ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(tool, json.dumps(arguments), ctx)


@pytest.mark.parametrize(
    ("umask", "dir_mode", "file_mode"),
    [
        (0o027, 0o750, 0o640),
        (0o077, 0o700, 0o600),
        (0o002, 0o775, 0o664),
        (0o022, 0o755, 0o644),
        (None, 0o755, 0o644),  # no client mask: this process's own
    ],
    ids=["027", "077", "002", "022", "none"],
)
async def test_the_shell_tool_creates_with_the_context_umask(
    tmp_path: Path, umask: int | None, dir_mode: int, file_mode: int
) -> None:
    outcome = await call(Shell(), context(tmp_path, umask), command="mkdir d && touch d/f")
    assert outcome.output == "[exit code 0]"
    assert (mode(tmp_path / "d"), mode(tmp_path / "d" / "f")) == (dir_mode, file_mode)


async def test_the_wrapper_keeps_the_command_its_arguments_and_its_exit_status(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path, 0o027)
    outcome = await call(
        Shell(), ctx, command='umask; echo "$0" "$#"; printf "%s\\n" "a  b" >&2; exit 3'
    )
    assert outcome.output == "0027\n/bin/sh 0\na  b\n[exit code 3]"
    # The process group is still the shell's own (the wrapper execs, it does not fork).
    outcome = await call(Shell(), ctx, command='test "$(ps -o pgid= -p $$)" -eq $$ && echo own')
    assert outcome.output == "own\n[exit code 0]"


def test_under_umask_wraps_only_for_another_mask() -> None:
    argv = ["prog", "-x", "a b"]
    assert under_umask(argv, None) == argv
    assert under_umask(argv, current_umask()) == argv
    wrapped = under_umask(argv, 0o027)
    assert wrapped[0] == "/bin/sh" and wrapped[-3:] == argv and "0027" in wrapped


@pytest.mark.parametrize(
    ("umask", "dir_mode", "file_mode"),
    [(0o027, 0o750, 0o640), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664), (None, 0o755, 0o644)],
    ids=["027", "077", "002", "none"],
)
async def test_write_file_creates_files_and_parents_with_the_context_umask(
    tmp_path: Path, umask: int | None, dir_mode: int, file_mode: int
) -> None:
    (tmp_path / "kept").mkdir(mode=0o711)
    os.chmod(tmp_path / "kept", 0o711)
    ctx = context(tmp_path, umask)
    outcome = await call(WriteFile(), ctx, path="kept/new/deeper/file.txt", content="x\n")
    assert not outcome.is_error, outcome
    assert (tmp_path / "kept" / "new" / "deeper" / "file.txt").read_text() == "x\n"
    assert mode(tmp_path / "kept") == 0o711  # an existing directory keeps its mode
    assert mode(tmp_path / "kept" / "new") == dir_mode
    assert mode(tmp_path / "kept" / "new" / "deeper") == dir_mode
    assert mode(tmp_path / "kept" / "new" / "deeper" / "file.txt") == file_mode
    outcome = await call(WriteFile(), ctx, path="top.txt", content="y")
    assert mode(tmp_path / "top.txt") == file_mode


async def test_an_existing_file_keeps_its_mode_on_write_and_edit(tmp_path: Path) -> None:
    target = tmp_path / "script.sh"
    target.write_text("echo one\n")
    target.chmod(0o751)
    ctx = context(tmp_path, 0o077)
    outcome = await call(WriteFile(), ctx, path="script.sh", content="echo two\n")
    assert outcome.output.startswith("Updated")
    assert mode(target) == 0o751
    outcome = await call(EditFile(), ctx, path="script.sh", old_string="two", new_string="3")
    assert not outcome.is_error, outcome
    assert (target.read_text(), mode(target)) == ("echo 3\n", 0o751)


def _server_umasks() -> list[int]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if SERVER_SCRIPT not in child.cmdline():
                continue
            status = Path(f"/proc/{child.pid}/status").read_text()
        except (psutil.Error, OSError):
            continue
        for line in status.splitlines():
            if line.startswith("Umask:"):
                found.append(int(line.split()[1], 8))
    return found


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("umask", [0o027, 0o077], ids=["027", "077"])
async def test_an_mcp_server_runs_under_the_context_umask(tmp_path: Path, umask: int) -> None:
    server = McpServerSpec("echo", sys.executable, (SERVER_SCRIPT,))
    ctx = context(tmp_path, umask)
    async with McpToolset([server], ctx) as toolset:
        assert toolset.failed_servers == ()
        tools = {tool.name: tool for tool in toolset.tools()}
        outcome = await call(tools["mcp__echo__echo"], ctx, text="hi")
        assert outcome.output == "hi"
        assert _server_umasks() == [umask]
    assert _server_umasks() == []


async def test_a_missing_mcp_server_under_the_wrapper_fails_only_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broken server's wrapper exits at once, so its pid is looked for until the lookup
    # gives up (2 s); a process found at all is found within milliseconds of its spawn.
    monkeypatch.setattr(mcp, "_FIND_PID_SECONDS", 0.3)
    servers = [
        McpServerSpec("echo", sys.executable, (SERVER_SCRIPT,)),
        McpServerSpec("broken", str(tmp_path / "no-such-server")),
    ]
    async with McpToolset(servers, context(tmp_path, 0o027), startup_timeout=10) as toolset:
        assert toolset.failed_servers == ("broken",)
        assert any(tool.name == "mcp__echo__echo" for tool in toolset.tools())
