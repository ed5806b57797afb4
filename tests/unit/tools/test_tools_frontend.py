"""The file tools' frontend seam (``tools.frontend``): call details, bounded diffs, and
reads and writes through an editor's file system when the frontend offers one.

The editor here is an in-memory one (its buffers by project-relative path), the shape of
what the core's ``TurnEditor`` does over the v2 connection; the process tests drive the
real thing through ``magi-code --app acp``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from magi_code.tools.base import ToolContext, ToolOutcome, run_tool
from magi_code.tools.files import EditFile, ReadFile, WriteFile
from magi_code.tools.frontend import (
    MAX_ARGUMENT_BYTES,
    MAX_DIFF_TEXT_BYTES,
    MAX_EDITOR_FILE_BYTES,
    EditorFailed,
    call_detail,
)


class MemoryEditor:
    def __init__(self, buffers: dict[str, str], reads: bool = True, writes: bool = True) -> None:
        self.buffers = buffers
        self.reads = reads
        self.writes = writes

    async def read_text(self, path: str) -> str:
        if path not in self.buffers:
            raise EditorFailed(f"The editor could not read {path}: not found")
        return self.buffers[path]

    async def write_text(self, path: str, content: str) -> None:
        self.buffers[path] = content


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "app.py").write_text("x = 1\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    return root


@pytest.fixture
def details() -> list[dict[str, Any]]:
    return []


def context(project: Path, details: list[dict[str, Any]], editor: Any = None) -> ToolContext:
    return ToolContext(project_dir=project, details=details.append, editor=editor)


async def call(tool: Any, ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(tool, json.dumps(arguments), ctx)


def test_a_call_detail_names_its_project_paths_and_bounds_its_arguments(project: Path) -> None:
    detail = call_detail("read_file", json.dumps({"path": "./app.py", "offset": 3}), project)
    assert detail == {
        "tool": "read_file",
        "arguments": {"path": "./app.py", "offset": 3},
        "truncated": False,
        "locations": [{"path": "app.py", "line": 3}],
    }
    long = call_detail(
        "write_file", json.dumps({"path": "../outside.txt", "content": "é" * 4096}), project
    )
    assert long is not None and long["truncated"] and long["locations"] == []
    assert len(long["arguments"]["content"].encode()) <= MAX_ARGUMENT_BYTES
    assert call_detail("shell", "not json", project) is None


async def test_edits_and_writes_on_disk_report_their_diff(
    project: Path, details: list[dict[str, Any]]
) -> None:
    ctx = context(project, details)
    assert not (await call(EditFile(), ctx, path="app.py", old_string="1", new_string="2")).is_error
    await call(WriteFile(), ctx, path="new.txt", content="new\n")
    await call(WriteFile(), ctx, path="big.txt", content="a" * (MAX_DIFF_TEXT_BYTES + 1))
    assert [d["diff"] for d in details[:2]] == [
        {"path": "app.py", "old_text": "x = 1\n", "new_text": "x = 2\n", "truncated": False},
        {"path": "new.txt", "old_text": None, "new_text": "new\n", "truncated": False},
    ]
    assert (
        details[2]["diff"]["truncated"]
        and len(details[2]["diff"]["new_text"]) == MAX_DIFF_TEXT_BYTES
    )
    assert (project / "app.py").read_text() == "x = 2\n"


async def test_the_editor_is_read_and_written_instead_of_the_disk(
    project: Path, details: list[dict[str, Any]]
) -> None:
    editor = MemoryEditor({"app.py": "x = 1\nunsaved\n"})
    ctx = context(project, details, editor)
    assert (await call(ReadFile(), ctx, path="app.py", offset=2)).output == "unsaved\n"
    edited = await call(EditFile(), ctx, path="app.py", old_string="x = 1", new_string="x = 3")
    assert edited == ToolOutcome("Replaced 1 occurrence(s) in app.py.")
    assert (await call(WriteFile(), ctx, path="new.txt", content="n\n")).output.startswith(
        "Created"
    )
    assert editor.buffers == {"app.py": "x = 3\nunsaved\n", "new.txt": "n\n"}
    assert (project / "app.py").read_text() == "x = 1\n" and not (project / "new.txt").exists()
    assert details[0]["diff"]["old_text"] == "x = 1\nunsaved\n"
    # Confinement still holds, and the editor's failure is the model's error.
    outside = await call(ReadFile(), ctx, path="../outside.txt")
    assert outside.is_error and "outside the project" in outside.output
    missing = await call(ReadFile(), ctx, path="gone.py")
    assert missing == ToolOutcome.error("The editor could not read gone.py: not found")
    too_big = await call(
        WriteFile(), ctx, path="big.txt", content="a" * (MAX_EDITOR_FILE_BYTES + 1)
    )
    assert too_big.is_error and "big.txt" not in editor.buffers


async def test_an_editor_that_only_reads_leaves_edits_to_the_disk(
    project: Path, details: list[dict[str, Any]]
) -> None:
    editor = MemoryEditor({"app.py": "x = 1\nunsaved\n"}, writes=False)
    ctx = dataclasses.replace(context(project, details, editor), details=None)
    await call(EditFile(), ctx, path="app.py", old_string="x = 1", new_string="x = 4")
    assert (project / "app.py").read_text() == "x = 4\n"
    assert editor.buffers == {"app.py": "x = 1\nunsaved\n"}
