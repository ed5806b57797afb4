"""Checkpoints of the files a turn's tools change (RFC-0002 §6.16; ``sessions.checkpoints``).

The built-in tools that change files are wrapped (:func:`checkpointed`, innermost: only a
call that really runs is seen):

- ``write_file`` and ``edit_file``: the file the call names is read before the call (its
  content kept as a checkpoint blob) and after it; when it changed, a ``file_change``
  record says from which content to which.
- ``shell``: when the project directory is in a git work tree, the files git tracks under
  it (``git ls-files``) are read before the command and compared after it; each one the
  command changed is checkpointed from the content read before (held in memory during
  the call). Bounded: past ``MAX_SNAPSHOT_FILES`` tracked files or ``MAX_SNAPSHOT_BYTES``
  of them, or without git, a shell call is not checkpointed. Files git does not track
  (new, ignored) never are. A turn reads only the files whose size, times or inode
  changed since its previous snapshot.

Other tools (MCP servers, writes through the editor's buffers, §6.8, that never reach
the disk) are not checkpointed. A checkpoint that cannot be written never fails the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from magi_code.sessions.checkpoints import Checkpoints, Content, NotAFile, read_content
from magi_code.tools.base import Tool, ToolContext, ToolInputError, ToolOutcome, WrappedTool
from magi_code.tools.environment import child_environment
from magi_code.tools.paths import display_path, project_root, resolve_in_project

from .agent import TurnSink

FILE_TOOLS: Final = frozenset({"write_file", "edit_file"})
SHELL_TOOL: Final = "shell"
MAX_SNAPSHOT_FILES: Final = 5_000
MAX_SNAPSHOT_BYTES: Final = 32 * 1024 * 1024
# ``git ls-files`` output read at most (far more than MAX_SNAPSHOT_FILES paths need).
MAX_LISTING_BYTES: Final = 4 * 1024 * 1024
GIT_TIMEOUT: Final = 10.0

_StatKey = tuple[int, int, int, int]
_Snapshot = dict[str, tuple[_StatKey, Content]]


class TurnCheckpoints:
    """One turn's checkpoints into its session's blobs, recorded through its sink."""

    def __init__(self, blobs: Checkpoints, sink: TurnSink, turn_id: str) -> None:
        self._blobs = blobs
        self._sink = sink
        self._turn_id = turn_id
        self._tracked: _Snapshot = {}  # the last shell snapshot, reused where unchanged

    async def around_file(
        self, tool: Tool, arguments: Mapping[str, object], ctx: ToolContext
    ) -> ToolOutcome:
        raw = arguments.get("path")
        target = await asyncio.to_thread(_target, ctx.project_dir, raw)
        before = None if target is None else await asyncio.to_thread(self._keep, target[1])
        outcome = await tool.run(arguments, ctx)
        if target is not None and before is not None:
            root, path = target
            after = await asyncio.to_thread(_read, path)
            if after is not None and after.digest != before.digest:
                await self._record(root, display_path(root, path), before, after)
        return outcome

    async def around_shell(
        self, tool: Tool, arguments: Mapping[str, object], ctx: ToolContext
    ) -> ToolOutcome:
        root = await asyncio.to_thread(_root, ctx.project_dir)
        tracked = None if root is None else await _tracked(root, ctx)
        snapshot = None
        if root is not None and tracked is not None:
            snapshot = await asyncio.to_thread(self._snapshot, root, tracked)
        outcome = await tool.run(arguments, ctx)
        if root is not None and snapshot is not None:
            changed = await asyncio.to_thread(self._changed, root, snapshot)
            for name, before, after in changed:
                if before.data is not None:
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(self._blobs.save, before.data)
                await self._record(root, name, before, after)
        return outcome

    def _keep(self, path: Path) -> Content | None:
        """The file before a change, its content kept when it fits (None: not a file a
        checkpoint covers). Blocking."""
        content = _read(path)
        if content is not None and content.data is not None:
            with contextlib.suppress(OSError):
                self._blobs.save(content.data)
        return content

    def _snapshot(self, root: Path, tracked: Sequence[str]) -> _Snapshot | None:
        if len(tracked) > MAX_SNAPSHOT_FILES:
            return None
        snapshot: _Snapshot = {}
        total = 0
        for name in tracked:
            key = _stat_key(root / name)
            if key is None:
                continue
            total += key[1]
            if total > MAX_SNAPSHOT_BYTES:
                return None
            known = self._tracked.get(name)
            if known is not None and known[0] == key:
                snapshot[name] = known
                continue
            content = _read(root / name)
            if content is not None:
                snapshot[name] = (key, content)
        self._tracked = snapshot
        return snapshot

    def _changed(self, root: Path, snapshot: _Snapshot) -> list[tuple[str, Content, Content]]:
        changed = []
        for name, (key, before) in snapshot.items():
            if _stat_key(root / name) == key:
                continue
            after = _read(root / name)
            if after is not None and after.digest != before.digest:
                changed.append((name, before, after))
        return changed

    async def _record(self, root: Path, name: str, before: Content, after: Content) -> None:
        await self._sink.record(
            {
                "type": "file_change",
                "turn_id": self._turn_id,
                "root": str(root),
                "path": name,
                "before": before.digest,
                "after": after.digest,
            }
        )


class _Checkpointed(WrappedTool):
    def __init__(self, tool: Tool, checkpoints: TurnCheckpoints) -> None:
        super().__init__(tool)
        self._checkpoints = checkpoints

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        if self.name == SHELL_TOOL:
            return await self._checkpoints.around_shell(self._tool, arguments, ctx)
        return await self._checkpoints.around_file(self._tool, arguments, ctx)


def checkpointed(tools: Sequence[Tool], checkpoints: TurnCheckpoints) -> list[Tool]:
    """``tools`` with the ones that change files wrapped."""
    wrapped = FILE_TOOLS | {SHELL_TOOL}
    return [_Checkpointed(t, checkpoints) if t.name in wrapped else t for t in tools]


def _root(project_dir: Path) -> Path | None:
    try:
        return project_root(project_dir)
    except ToolInputError:
        return None


def _target(project_dir: Path, raw: object) -> tuple[Path, Path] | None:
    """The project root and the file a file tool's ``path`` names (None: the tool
    refuses it itself)."""
    root = _root(project_dir)
    if root is None or not isinstance(raw, str):
        return None
    try:
        path = resolve_in_project(root, raw)
    except ToolInputError:
        return None
    return (root, path) if path != root else None


def _read(path: Path) -> Content | None:
    try:
        return read_content(path)
    except (NotAFile, OSError):
        return None


def _stat_key(path: Path) -> _StatKey | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


async def _tracked(root: Path, ctx: ToolContext) -> list[str] | None:
    """The files git tracks under ``root`` (relative), or None: not a git work tree, no
    git, or too many."""
    env = child_environment(ctx.env, secret_names=ctx.secret_names)
    env["GIT_OPTIONAL_LOCKS"] = "0"  # a listing never writes the index
    try:
        proc = await asyncio.create_subprocess_exec(
            "git",
            "-c",
            "core.fsmonitor=false",
            "ls-files",
            "-z",
            cwd=root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(GIT_TIMEOUT):
            listing = b""
            while chunk := await proc.stdout.read(64 * 1024):
                listing += chunk
                if len(listing) > MAX_LISTING_BYTES:
                    return None
            if await proc.wait() != 0:
                return None
    except TimeoutError:
        return None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    names = [os.fsdecode(name) for name in listing.split(b"\0") if name]
    return names if len(names) <= MAX_SNAPSHOT_FILES else None
