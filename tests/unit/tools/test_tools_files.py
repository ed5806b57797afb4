"""File tools against a real project directory (issue: built-in tools in the launch project)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.tools import files
from magi_code.tools.base import Tool, ToolContext, ToolOutcome, run_tool
from magi_code.tools.files import (
    MAX_GREP_MATCHES,
    MAX_LIST_RESULTS,
    READ_BUDGET_BYTES,
    EditFile,
    Grep,
    ListFiles,
    ReadFile,
    WriteFile,
)
from magi_code.tools.paths import glob_regex


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return 1\n")
    (root / "src" / "util.py").write_text("def helper():\n    return 'x'\n")
    (root / "README.md").write_text("# Demo\nmain entry\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("main = hidden\n")
    (tmp_path / "outside.txt").write_text("outside secret\n")
    return root


@pytest.fixture
def ctx(project: Path) -> ToolContext:
    return ToolContext(project_dir=project, env={})


async def call(tool: Tool, ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(tool, json.dumps(arguments), ctx)


# read_file


async def test_read_file_returns_content(ctx: ToolContext) -> None:
    outcome = await call(ReadFile(), ctx, path="src/app.py")
    assert outcome == ToolOutcome("import os\n\ndef main():\n    return 1\n")


async def test_read_file_offset_and_limit_select_lines(ctx: ToolContext) -> None:
    outcome = await call(ReadFile(), ctx, path="src/app.py", offset=3, limit=1)
    assert not outcome.is_error
    assert outcome.output.startswith("def main():\n")
    assert "offset=4" in outcome.output


async def test_read_file_splits_long_files_within_the_budget(ctx: ToolContext) -> None:
    line = "x" * 99 + "\n"
    (ctx.project_dir / "big.txt").write_text(line * 2000)
    first = await call(ReadFile(), ctx, path="big.txt")
    assert len(first.output.encode()) <= READ_BUDGET_BYTES + 100
    assert "[more lines follow; continue with offset=" in first.output
    shown = first.output.count(line)
    follow = await call(ReadFile(), ctx, path="big.txt", offset=shown + 1)
    assert follow.output.startswith(line)


async def test_read_file_refuses_binary_and_missing_files(ctx: ToolContext) -> None:
    (ctx.project_dir / "blob.bin").write_bytes(b"\x00\x01\x02")
    binary = await call(ReadFile(), ctx, path="blob.bin")
    assert binary.is_error and "binary" in binary.output
    missing = await call(ReadFile(), ctx, path="nope.txt")
    assert missing.is_error and "does not exist" in missing.output


@pytest.mark.timeout(30)
async def test_a_fifo_is_refused_without_blocking(ctx: ToolContext) -> None:
    # No writer ever opens it: a plain open would wait for one, holding a worker thread
    # (and in the daemon, a thread every frontend's turns share) for good.
    os.mkfifo(ctx.project_dir / "pipe")
    read = await call(ReadFile(), ctx, path="pipe")
    assert read == ToolOutcome.error("pipe is not a regular file.")
    edit = await call(EditFile(), ctx, path="pipe", old_string="a", new_string="b")
    assert edit == ToolOutcome.error("pipe is not a regular file.")
    assert stat.S_ISFIFO((ctx.project_dir / "pipe").lstat().st_mode)


@pytest.mark.parametrize(
    "bad", [{}, {"path": 3}, {"path": "a", "offset": 0}, {"path": "a", "limit": True}]
)
async def test_read_file_rejects_invalid_arguments(
    ctx: ToolContext, bad: dict[str, object]
) -> None:
    outcome = await run_tool(ReadFile(), json.dumps(bad), ctx)
    assert outcome.is_error


@pytest.mark.parametrize("escape", ["../outside.txt", "src/../../outside.txt"])
async def test_paths_cannot_escape_with_dotdot(ctx: ToolContext, escape: str) -> None:
    outcome = await call(ReadFile(), ctx, path=escape)
    assert outcome.is_error
    assert "outside the project" in outcome.output
    assert "secret" not in outcome.output


async def test_absolute_paths_only_inside_the_project(ctx: ToolContext) -> None:
    outside = ctx.project_dir.parent / "outside.txt"
    refused = await call(ReadFile(), ctx, path=str(outside))
    assert refused.is_error and "outside the project" in refused.output
    inside = await call(ReadFile(), ctx, path=str(ctx.project_dir / "README.md"))
    assert inside == ToolOutcome("# Demo\nmain entry\n")


async def test_symlink_pointing_outside_is_refused(ctx: ToolContext) -> None:
    outside = ctx.project_dir.parent / "outside.txt"
    (ctx.project_dir / "link.txt").symlink_to(outside)
    (ctx.project_dir / "linkdir").symlink_to(ctx.project_dir.parent)
    for path in ("link.txt", "linkdir/outside.txt"):
        outcome = await call(ReadFile(), ctx, path=path)
        assert outcome.is_error and "outside the project" in outcome.output
    write = await call(WriteFile(), ctx, path="link.txt", content="overwritten")
    assert write.is_error
    assert outside.read_text() == "outside secret\n"


async def test_symlink_inside_the_project_is_followed(ctx: ToolContext) -> None:
    (ctx.project_dir / "alias.py").symlink_to(ctx.project_dir / "src" / "util.py")
    outcome = await call(ReadFile(), ctx, path="alias.py")
    assert outcome.output.startswith("def helper")


# write_file


async def test_write_file_creates_parents_and_overwrites(ctx: ToolContext) -> None:
    created = await call(WriteFile(), ctx, path="new/dir/file.txt", content="hello\n")
    assert not created.is_error and "Created" in created.output
    target = ctx.project_dir / "new" / "dir" / "file.txt"
    assert target.read_text() == "hello\n"
    target.chmod(0o755)
    updated = await call(WriteFile(), ctx, path="new/dir/file.txt", content="")
    assert "Updated" in updated.output
    assert target.read_text() == ""
    assert target.stat().st_mode & 0o777 == 0o755


async def test_write_file_refuses_directories_and_escapes(ctx: ToolContext) -> None:
    assert (await call(WriteFile(), ctx, path="src", content="x")).is_error
    assert (await call(WriteFile(), ctx, path="../evil.txt", content="x")).is_error
    assert not (ctx.project_dir.parent / "evil.txt").exists()


# edit_file


async def test_edit_file_replaces_a_unique_exact_string(ctx: ToolContext) -> None:
    outcome = await call(
        EditFile(), ctx, path="src/app.py", old_string="return 1", new_string="return 2"
    )
    assert outcome == ToolOutcome("Replaced 1 occurrence(s) in src/app.py.")
    assert (ctx.project_dir / "src" / "app.py").read_text().endswith("return 2\n")


async def test_edit_file_rejects_ambiguous_and_missing_strings(ctx: ToolContext) -> None:
    path = ctx.project_dir / "dup.txt"
    path.write_text("a = 1\na = 1\n")
    ambiguous = await call(EditFile(), ctx, path="dup.txt", old_string="a = 1", new_string="b")
    assert ambiguous.is_error and "2 times" in ambiguous.output
    missing = await call(EditFile(), ctx, path="dup.txt", old_string="zzz", new_string="b")
    assert missing.is_error and "not found" in missing.output
    same = await call(EditFile(), ctx, path="dup.txt", old_string="a", new_string="a")
    assert same.is_error
    assert path.read_text() == "a = 1\na = 1\n"


async def test_edit_file_replace_all(ctx: ToolContext) -> None:
    path = ctx.project_dir / "dup.txt"
    path.write_text("a = 1\na = 1\n")
    outcome = await call(
        EditFile(), ctx, path="dup.txt", old_string="a = 1", new_string="b", replace_all=True
    )
    assert outcome == ToolOutcome("Replaced 2 occurrence(s) in dup.txt.")
    assert path.read_text() == "b\nb\n"


async def test_edit_file_refuses_escape_and_missing_file(ctx: ToolContext) -> None:
    escape = await call(EditFile(), ctx, path="../outside.txt", old_string="secret", new_string="x")
    assert escape.is_error
    assert (ctx.project_dir.parent / "outside.txt").read_text() == "outside secret\n"
    missing = await call(EditFile(), ctx, path="gone.txt", old_string="a", new_string="b")
    assert missing.is_error and "does not exist" in missing.output


# list_files


async def test_list_files_globs_sorted_and_skips_git(ctx: ToolContext) -> None:
    everything = await call(ListFiles(), ctx, pattern="**/*")
    assert everything.output.split("\n") == ["README.md", "src/", "src/app.py", "src/util.py"]
    top = await call(ListFiles(), ctx, pattern="*")
    assert top.output.split("\n") == ["README.md", "src/"]
    python = await call(ListFiles(), ctx, pattern="*.py", path="src")
    assert python.output.split("\n") == ["app.py", "util.py"]
    braces = await call(ListFiles(), ctx, pattern="**/*.{md,py}")
    assert braces.output.split("\n") == ["README.md", "src/app.py", "src/util.py"]


async def test_list_files_of_a_file_a_missing_path_or_an_empty_directory(
    ctx: ToolContext,
) -> None:
    for path in ("README.md", "missing", "src/app.py/deeper"):
        outcome = await call(ListFiles(), ctx, pattern="*", path=path)
        assert outcome.is_error and outcome.output == f"{path} is not a directory.", path
    (ctx.project_dir / "empty").mkdir()
    empty = await call(ListFiles(), ctx, pattern="*", path="empty")
    assert not empty.is_error and empty.output == "No files match."


async def test_list_files_is_bounded(ctx: ToolContext) -> None:
    many = ctx.project_dir / "many"
    many.mkdir()
    for index in range(MAX_LIST_RESULTS + 5):
        (many / f"f{index:04d}.txt").write_text("")
    outcome = await call(ListFiles(), ctx, pattern="many/*.txt")
    lines = outcome.output.split("\n")
    assert lines[0] == "many/f0000.txt"
    assert lines[-1] == "[5 more matches not shown]"


@pytest.mark.parametrize("bound", [2, 3, 4])
async def test_list_files_and_grep_stop_scanning_at_the_bound(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch, bound: int
) -> None:
    # Walk order: the root's directories, its files, then each subdirectory's entries.
    monkeypatch.setattr(files, "MAX_SCAN_ENTRIES", bound)
    listed = (await call(ListFiles(), ctx, pattern="**/*")).output.split("\n")
    grepped = (await call(Grep(), ctx, pattern="return")).output.split("\n")
    stopped = f"[scan stopped after {bound} entries; narrow pattern or path]"
    if bound == 4:  # exactly every entry: the scan is complete
        assert listed == ["README.md", "src/", "src/app.py", "src/util.py"]
        assert grepped == ["src/app.py:4:    return 1", "src/util.py:2:    return 'x'"]
    elif bound == 3:
        assert listed == ["README.md", "src/", "src/app.py", stopped]
        assert grepped == ["src/app.py:4:    return 1"]
    else:  # the bound at the end of a directory's batch, more to come
        assert listed == ["README.md", "src/", stopped]
        assert grepped == ["No matches."]


async def test_list_files_rejects_escaping_patterns(ctx: ToolContext) -> None:
    for bad in ({"pattern": "../*"}, {"pattern": "/etc/*"}, {"pattern": "*", "path": ".."}):
        assert (await run_tool(ListFiles(), json.dumps(bad), ctx)).is_error


async def test_directory_links_are_listed_not_entered(ctx: ToolContext) -> None:
    (ctx.project_dir / "alias").symlink_to(ctx.project_dir / "src")
    listed = await call(ListFiles(), ctx, pattern="**/*")
    assert listed.output.split("\n") == [
        "README.md",
        "alias/",
        "src/",
        "src/app.py",
        "src/util.py",
    ]
    grepped = await call(Grep(), ctx, pattern="return")
    assert grepped.output.split("\n") == [
        "src/app.py:4:    return 1",
        "src/util.py:2:    return 'x'",
    ]
    # Named as the path itself, a link inside the project is followed.
    through = await call(ListFiles(), ctx, pattern="*.py", path="alias")
    assert through.output.split("\n") == ["app.py", "util.py"]


async def test_a_missing_project_is_refused_by_every_read(tmp_path: Path) -> None:
    gone = ToolContext(project_dir=tmp_path / "gone", env={})
    for tool, arguments in (
        (ReadFile(), {"path": "a.py"}),
        (ListFiles(), {"pattern": "*"}),
        (Grep(), {"pattern": "x"}),
    ):
        outcome = await call(tool, gone, **arguments)
        assert outcome == ToolOutcome.error("The project directory is not available.")


async def test_a_cancelled_read_returns_without_waiting_for_its_thread(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The walk runs in a worker thread: cancelling the call ends it at once (the turn
    # goes on), and the thread finishes its bounded work by itself.
    entered, release = threading.Event(), threading.Event()
    walk = files._walk

    def held(base: Path, *, max_depth: int | None = None) -> Iterator[tuple[str, bool]]:
        entered.set()
        release.wait(30)
        return walk(base, max_depth=max_depth)

    monkeypatch.setattr(files, "_walk", held)
    for tool, arguments in ((ListFiles(), {"pattern": "*"}), (Grep(), {"pattern": "x"})):
        entered.clear()
        release.clear()
        task = asyncio.create_task(call(tool, ctx, **arguments))
        assert await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            assert not release.is_set()  # the thread is still held
        finally:
            release.set()


def test_glob_regex_semantics() -> None:
    assert glob_regex("*.py").match("a.py")
    assert not glob_regex("*.py").match("src/a.py")
    assert glob_regex("**/*.py").match("a.py")
    assert glob_regex("**/*.py").match("src/deep/a.py")
    assert glob_regex("src/**").match("src/x/y")
    assert glob_regex("file?.[ch]").match("file1.c")
    assert not glob_regex("file[!0-9].c").match("file1.c")


# grep


async def test_grep_finds_lines_and_skips_git_and_binaries(ctx: ToolContext) -> None:
    (ctx.project_dir / "data.bin").write_bytes(b"main\x00\x01")
    outcome = await call(Grep(), ctx, pattern=r"\bmain\b")
    assert outcome.output.split("\n") == ["README.md:2:main entry", "src/app.py:3:def main():"]


async def test_grep_glob_path_and_no_match(ctx: ToolContext) -> None:
    only_py = await call(Grep(), ctx, pattern="return", glob="*.py")
    assert only_py.output.split("\n") == [
        "src/app.py:4:    return 1",
        "src/util.py:2:    return 'x'",
    ]
    one_file = await call(Grep(), ctx, pattern="return", path="src/util.py")
    assert one_file.output == "src/util.py:2:    return 'x'"
    none = await call(Grep(), ctx, pattern="nothing-here")
    assert none == ToolOutcome("No matches.")


async def test_grep_rejects_bad_regex_and_escapes(ctx: ToolContext) -> None:
    bad = await call(Grep(), ctx, pattern="(unclosed")
    assert bad.is_error and "regular expression" in bad.output
    escape = await call(Grep(), ctx, pattern="secret", path="..")
    assert escape.is_error and "outside the project" in escape.output


async def test_grep_does_not_follow_symlinks_out(ctx: ToolContext) -> None:
    (ctx.project_dir / "link.txt").symlink_to(ctx.project_dir.parent / "outside.txt")
    outcome = await call(Grep(), ctx, pattern="outside")
    assert outcome == ToolOutcome("No matches.")


async def test_grep_bounds_matches(ctx: ToolContext) -> None:
    (ctx.project_dir / "lots.txt").write_text("hit\n" * (MAX_GREP_MATCHES + 10))
    outcome = await call(Grep(), ctx, pattern="hit", path="lots.txt")
    lines = outcome.output.split("\n")
    assert len(lines) == MAX_GREP_MATCHES + 1
    assert "stopped after" in lines[-1]
