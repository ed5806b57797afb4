"""``grep`` runs its regular expression in a worker process: a catastrophic pattern that
is cancelled or times out leaves no busy thread and no process behind, and ordinary
searches give exactly what the in-process search gave."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

import psutil
import pytest

from magi_code.tools import files
from magi_code.tools.base import ToolContext, ToolOutcome, run_tool
from magi_code.tools.files import (
    BINARY_SNIFF_BYTES,
    MAX_GREP_FILE_BYTES,
    MAX_GREP_LINE_CHARS,
    MAX_GREP_MATCHES,
    MAX_GREP_TOTAL_BYTES,
    Grep,
    _grep_targets,
)

CATASTROPHIC = {"pattern": r"(a+)+$", "path": "evil.txt"}


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    root = tmp_path / "project"
    root.mkdir()
    (root / "evil.txt").write_text("a" * 64 + "b\n")
    return ToolContext(project_dir=root, env={})


async def grep(ctx: ToolContext, **arguments: object) -> ToolOutcome:
    return await run_tool(Grep(), json.dumps(arguments), ctx)


def workers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:  # gone since it was listed
            continue
    return found


# Half a second of wall time: a search thread left backtracking would use all of it.
IDLE_WINDOW = 0.5


def busy_cpu_seconds(window: float = IDLE_WINDOW) -> float:
    """CPU time this process used over ``window`` seconds of wall time."""
    me = psutil.Process()
    before = sum(me.cpu_times()[:2])
    time.sleep(window)
    return sum(me.cpu_times()[:2]) - before


async def settled_threads(baseline: int) -> int:
    # Subprocess watcher threads (outside uvloop) end with their child.
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return threading.active_count()


async def test_a_cancelled_catastrophic_search_leaves_nothing_running(ctx: ToolContext) -> None:
    assert (await grep(ctx, pattern="b", path="evil.txt")).output == "evil.txt:1:" + "a" * 64 + "b"
    baseline = threading.active_count()
    task = asyncio.create_task(grep(ctx, **CATASTROPHIC))
    deadline = time.monotonic() + 10
    while not workers():  # the worker is searching
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5
    assert workers() == []
    assert await settled_threads(baseline) <= baseline
    # Nothing keeps backtracking: the process is idle (a search thread would burn a core).
    assert await asyncio.to_thread(busy_cpu_seconds) < 0.3 * IDLE_WINDOW
    # And the tool works as before afterwards.
    assert (await grep(ctx, pattern="^a+b$")).output == "evil.txt:1:" + "a" * 64 + "b"


async def test_a_catastrophic_search_times_out_and_leaves_nothing_running(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "GREP_TIMEOUT_SECONDS", 0.3)
    await grep(ctx, pattern="b")  # the thread pool's worker exists (idle) from here on
    baseline = threading.active_count()
    started = time.monotonic()
    outcome = await grep(ctx, **CATASTROPHIC)
    assert 0.3 <= time.monotonic() - started < 6
    assert outcome.is_error and outcome.timed_out is True
    assert "did not finish within 0.3 s" in outcome.output
    assert workers() == []
    assert await settled_threads(baseline) <= baseline
    assert await asyncio.to_thread(busy_cpu_seconds) < 0.3 * IDLE_WINDOW


# -- same output as the in-process search ------------------------------------------------


def reference_grep(project_dir: Path, raw_path: str, pattern: str, file_glob: str | None) -> str:
    """The search as it ran in a thread before the worker (kept here verbatim)."""
    regex = re.compile(pattern)
    results: list[str] = []
    total = 0
    note = ""
    targets = _grep_targets(project_dir, raw_path, file_glob)
    for shown, path in targets:
        data = _reference_read(Path(path))
        if data is None:
            continue
        total += len(data)
        if total > MAX_GREP_TOTAL_BYTES:
            note = "[search stopped at its byte budget; narrow path or glob]"
            break
        for line_no, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
            if regex.search(line):
                results.append(f"{shown}:{line_no}:{line.rstrip(chr(13))[:MAX_GREP_LINE_CHARS]}")
                if len(results) >= MAX_GREP_MATCHES:
                    break
        if len(results) >= MAX_GREP_MATCHES:
            note = f"[stopped after {MAX_GREP_MATCHES} matches; narrow the search]"
            break
    if not results:
        results.append("No matches.")
    if note:
        results.append(note)
    return "\n".join(results)


def _reference_read(path: Path) -> bytes | None:
    try:
        stat = path.lstat()
        if not path.is_file() or path.is_symlink() or stat.st_size > MAX_GREP_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    return None if b"\0" in data[:BINARY_SNIFF_BYTES] else data


@pytest.fixture
def tree(tmp_path: Path) -> ToolContext:
    root = tmp_path / "tree"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("needle in git\n")
    (root / "src" / "a.py").write_text("def needle():\n    return 'x'\r\n# needle again\n")
    (root / "src" / "pkg" / "b.py").write_text("x = 1\nneedle = x\n" + "y" * 900 + "needle\n")
    (root / "src" / "pkg" / "c.txt").write_text("Needle upper\nno match\n")
    (root / "bad-utf8.txt").write_bytes(b"needle \xff\xfe broken\n")
    (root / "data.bin").write_bytes(b"needle\x00binary")
    (root / "many.txt").write_text("needle\n" * (MAX_GREP_MATCHES + 5))
    (root / "empty.txt").write_text("")
    (root / "ünïcode-名前.md").write_text("needle ü\n")
    os.mkfifo(root / "fifo")
    (root / "link.py").symlink_to(root / "src" / "a.py")
    (tmp_path / "outside.txt").write_text("needle outside\n")
    (root / "out-link.txt").symlink_to(tmp_path / "outside.txt")
    odd = os.fsencode(root) + b"/odd-\xe9.txt"
    with open(odd, "wb") as fh:
        fh.write(b"needle in an odd name\n")
    return ToolContext(project_dir=root, env={})


@pytest.mark.parametrize(
    ("pattern", "path", "file_glob"),
    [
        ("needle", ".", None),
        ("needle", "src", None),
        ("needle", "src/a.py", None),
        ("(?i)^needle", ".", "*.txt"),
        ("needle", ".", "src/**/*.py"),
        (r"\bx\b", ".", None),
        ("return 'x'$", ".", None),
        ("nothing-at-all", ".", None),
        ("^$", ".", None),
        ("ü", ".", "*.md"),
    ],
)
async def test_searches_give_the_in_process_search_output(
    tree: ToolContext, pattern: str, path: str, file_glob: str | None
) -> None:
    arguments: dict[str, object] = {"pattern": pattern, "path": path}
    if file_glob is not None:
        arguments["glob"] = file_glob
    expected = await asyncio.to_thread(reference_grep, tree.project_dir, path, pattern, file_glob)
    outcome = await grep(tree, **arguments)
    assert outcome == ToolOutcome(expected)


async def test_the_byte_budget_note_is_the_same(
    tree: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small budget stands in for 64 MiB of files (the worker gets it from the tool).
    monkeypatch.setattr(files, "MAX_GREP_TOTAL_BYTES", 500)
    outcome = await grep(tree, pattern="needle", path="src")
    assert outcome.output.endswith("[search stopped at its byte budget; narrow path or glob]")
    assert outcome.output.startswith("src/a.py:1:def needle():")


async def test_errors_are_those_of_the_tool(tree: ToolContext) -> None:
    missing = await grep(tree, pattern="x", path="nowhere")
    assert missing == ToolOutcome.error("nowhere does not exist.")
    escape = await grep(tree, pattern="needle", path="..")
    assert escape.is_error and "outside the project" in escape.output
    bad = await grep(tree, pattern="(unclosed")
    assert bad.is_error and bad.output.startswith("Invalid regular expression:")
    assert workers() == []
