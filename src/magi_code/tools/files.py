"""File tools: read, write, exact-string edit, glob listing and regex search.

All paths are confined to the project directory (``paths.resolve_in_project``). Every
operation is plain blocking code run through ``asyncio.to_thread``: a cancelled call
returns at once, and since each operation is bounded in what it reads and returns, its
thread finishes quickly. The one exception is the regular expression of ``grep``, which
no bound can stop: the search runs in a worker process (``grep_worker``) that
cancellation and a timeout kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO, Final

from magi_code.storage.files import atomic_write
from magi_code.storage.launch import current_umask
from magi_code.tools import grep_worker
from magi_code.tools.base import (
    BuiltinTool,
    ToolContext,
    ToolInputError,
    ToolOutcome,
    optional_bool,
    optional_int,
    optional_str,
    require_str,
    shielded,
)
from magi_code.tools.frontend import (
    EditorFailed,
    EditorFiles,
    editor_text_fits,
    report_diff,
)
from magi_code.tools.paths import (
    display_path,
    glob_depth,
    glob_regex,
    project_root,
    resolve_in_project,
    validate_glob,
)
from magi_code.tools.processes import (
    ChildLimitReached,
    child_slot,
    forget_child,
    record_child,
)

# read_file stays under the outcome bound on whole lines and tells the model where to go on.
READ_BUDGET_BYTES: Final = 30 * 1024
DEFAULT_READ_LINES: Final = 2000
MAX_READ_LINES: Final = 100_000
BINARY_SNIFF_BYTES: Final = 8192
MAX_EDIT_FILE_BYTES: Final = 16 * 1024 * 1024
MAX_LIST_RESULTS: Final = 500
MAX_SCAN_ENTRIES: Final = 100_000
SKIPPED_DIRS: Final = frozenset({".git"})
MAX_GREP_MATCHES: Final = 200
MAX_GREP_LINE_CHARS: Final = 400
MAX_GREP_FILE_BYTES: Final = 8 * 1024 * 1024
MAX_GREP_TOTAL_BYTES: Final = 64 * 1024 * 1024
GREP_TIMEOUT_SECONDS: Final = 60.0
# The worker's answer is at most 200 bounded lines; anything past this is not an answer.
MAX_GREP_WORKER_OUTPUT: Final = 4 * 1024 * 1024
# The worker's source as this process imported it (not re-read later: a daemon's worker
# searches as the daemon does after an upgrade replaced the files). ``-I -S``: no
# environment, no site packages, no current directory on the path; ``-X utf8``: file
# names round-trip through its JSON whatever the (empty) environment's locale.
GREP_WORKER_COMMAND: Final = (
    sys.executable,
    "-I",
    "-S",
    "-X",
    "utf8",
    "-c",
    Path(grep_worker.__file__).read_text(encoding="utf-8"),
)


def _os_failure(exc: OSError) -> ToolInputError:
    # strerror only: the exception's str() carries the absolute path.
    return ToolInputError(f"The file operation failed: {exc.strerror or 'I/O error'}.")


def _is_binary(head: bytes) -> bool:
    return b"\0" in head


class ReadFile(BuiltinTool):
    name = "read_file"
    read_only = True
    description = (
        "Read a UTF-8 text file in the project. Returns the file's lines verbatim. "
        "offset is the 1-based first line, limit the number of lines; long files are "
        "returned in parts with the offset to continue from."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the project."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Maximum lines."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        raw_path = require_str(arguments, "path")
        offset = optional_int(arguments, "offset", default=1, minimum=1, maximum=2**31)
        limit = optional_int(
            arguments, "limit", default=DEFAULT_READ_LINES, minimum=1, maximum=MAX_READ_LINES
        )
        editor = ctx.editor
        if editor is not None and editor.reads:
            _path, shown = await asyncio.to_thread(_editor_target, ctx.project_dir, raw_path)
            data = (await _editor_read(editor, shown)).encode("utf-8")
            return ToolOutcome(await asyncio.to_thread(_read_buffer, data, shown, offset, limit))
        text = await asyncio.to_thread(_read_file, ctx.project_dir, raw_path, offset, limit)
        return ToolOutcome(text)


def _editor_target(project_dir: Path, raw_path: str) -> tuple[Path, str]:
    """A file the editor reads or writes: confined to the project like any other."""
    root = project_root(project_dir)
    path = resolve_in_project(root, raw_path)
    shown = display_path(root, path)
    if path == root or path.is_dir():
        raise ToolInputError(f"{shown} is a directory.")
    return path, shown


async def _editor_read(editor: EditorFiles, shown: str) -> str:
    try:
        return await editor.read_text(shown)
    except EditorFailed as exc:
        raise ToolInputError(str(exc)) from None


async def _editor_write(editor: EditorFiles, shown: str, content: str) -> None:
    editor_text_fits(content, shown)
    try:
        await editor.write_text(shown, content)
    except EditorFailed as exc:
        raise ToolInputError(str(exc)) from None


def _open_regular(path: Path, shown: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file. Anything else (a FIFO, a
    device, a socket) is refused before a read could block the worker thread for good."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not S_ISREG(os.fstat(fd).st_mode):
            raise ToolInputError(f"{shown} is not a regular file.")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_file(project_dir: Path, raw_path: str, offset: int, limit: int) -> str:
    root = project_root(project_dir)
    path = resolve_in_project(root, raw_path)
    shown = display_path(root, path)
    if path.is_dir():
        raise ToolInputError(f"{shown} is a directory; use list_files.")
    try:
        with _open_regular(path, shown) as fh:
            if _is_binary(fh.read(BINARY_SNIFF_BYTES)):
                raise ToolInputError(f"{shown} is a binary file.")
            fh.seek(0)
            return _read_lines(fh, shown, offset, limit)
    except FileNotFoundError:
        raise ToolInputError(f"{shown} does not exist.") from None
    except OSError as exc:
        raise _os_failure(exc) from None


def _read_buffer(data: bytes, shown: str, offset: int, limit: int) -> str:
    with io.BytesIO(data) as fh:
        return _read_lines(fh, shown, offset, limit)


def _read_lines(fh: BinaryIO, shown: str, offset: int, limit: int) -> str:
    chunks: list[bytes] = []
    used = 0
    line_no = 0
    while True:
        line = fh.readline(READ_BUDGET_BYTES + 1)
        if not line:
            break
        line_no += 1
        if line_no < offset:
            _finish_line(fh, line)
            continue
        if len(chunks) >= limit or used + len(line) > READ_BUDGET_BYTES:
            if chunks:
                text = b"".join(chunks).decode("utf-8", errors="replace")
                return f"{text}\n[more lines follow; continue with offset={line_no}]"
            # A single line longer than the whole budget: show its start.
            _finish_line(fh, line)
            head = line[:READ_BUDGET_BYTES].decode("utf-8", errors="ignore")
            return f"{head}\n[line {line_no} truncated; continue with offset={line_no + 1}]"
        chunks.append(line)
        used += len(line)
    if not chunks:
        if line_no == 0:
            return f"({shown} is empty)"
        return f"({shown} has {line_no} lines; offset {offset} is past the end)"
    return b"".join(chunks).decode("utf-8", errors="replace")


def _finish_line(fh: BinaryIO, line: bytes) -> None:
    """Consume the rest of a line that ``readline`` cut at its size bound."""
    while line and not line.endswith(b"\n"):
        line = fh.readline(READ_BUDGET_BYTES)


class WriteFile(BuiltinTool):
    name = "write_file"
    description = (
        "Create or overwrite a file in the project with the given content "
        "(parent directories are created)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the project."},
            "content": {"type": "string", "description": "The complete new file content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        raw_path = require_str(arguments, "path")
        content = require_str(arguments, "content", allow_empty=True)
        editor, want_old = ctx.editor, ctx.details is not None
        if editor is not None and editor.writes:
            path, shown = await asyncio.to_thread(_editor_target, ctx.project_dir, raw_path)
            old: str | None = None
            if editor.reads:
                with contextlib.suppress(ToolInputError):  # a file the editor does not have
                    old = await _editor_read(editor, shown)
            else:
                old = await asyncio.to_thread(_old_text, path) if want_old else None
            await _editor_write(editor, shown, content)
            verb = "Updated" if old is not None or path.exists() else "Created"
            message = f"{verb} {shown} ({len(content.encode('utf-8'))} bytes)."
        else:
            message, shown, old = await asyncio.to_thread(
                _write_file, ctx.project_dir, raw_path, content, ctx.umask, want_old
            )
        report_diff(ctx.details, shown, old, content)
        return ToolOutcome(message)


def _old_text(path: Path) -> str | None:
    """A file's text before it is replaced, for the diff; None if it is not text."""
    try:
        with _open_regular(path, path.name) as fh:
            if os.fstat(fh.fileno()).st_size > MAX_EDIT_FILE_BYTES:
                return None
            return fh.read().decode("utf-8")
    except (OSError, UnicodeDecodeError, ToolInputError):
        return None


def _write_file(
    project_dir: Path, raw_path: str, content: str, umask: int | None, want_old: bool
) -> tuple[str, str, str | None]:
    """The message, the path shown and (when ``want_old``) the text it replaced."""
    root = project_root(project_dir)
    path, shown = _editor_target(root, raw_path)
    old = _old_text(path) if want_old else None
    data = content.encode("utf-8")
    # The modes a plain create under the client's umask gives; set explicitly, since this
    # process's own mask may be another (the daemon's is 077). An existing file keeps its.
    mask = current_umask() if umask is None else umask
    try:
        existed = path.exists()
        mode = path.stat().st_mode & 0o7777 if existed else 0o666 & ~mask
        _make_parents(root, path.parent, 0o777 & ~mask)
        atomic_write(path, data, mode)
    except OSError as exc:
        raise _os_failure(exc) from None
    verb = "Updated" if existed else "Created"
    return f"{verb} {shown} ({len(data)} bytes).", shown, old


def _make_parents(root: Path, directory: Path, mode: int) -> None:
    """Create the missing directories down to ``directory`` (inside ``root``) with ``mode``.

    Directories that exist, or that appear meanwhile, keep their mode. The mode is set on
    the opened directory, never through a path that may have been swapped for a symlink.
    """
    missing: list[Path] = []
    while directory != root and not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


class EditFile(BuiltinTool):
    name = "edit_file"
    description = (
        "Replace an exact string in a project file. old_string must match the file text "
        "exactly (including whitespace) and be unique unless replace_all is true."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the project."},
            "old_string": {"type": "string", "description": "Exact text to replace."},
            "new_string": {"type": "string", "description": "Replacement text."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence (default false).",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    }

    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        raw_path = require_str(arguments, "path")
        old = require_str(arguments, "old_string")
        new = require_str(arguments, "new_string", allow_empty=True)
        replace_all = optional_bool(arguments, "replace_all", default=False)
        if old == new:
            raise ToolInputError("old_string and new_string are identical.")
        editor = ctx.editor
        if editor is not None and editor.reads and editor.writes:
            # The editor's buffer is what is edited, saved or not.
            _path, shown = await asyncio.to_thread(_editor_target, ctx.project_dir, raw_path)
            text = await _editor_read(editor, shown)
            updated, count = _replace(text, old, new, replace_all, shown)
            await _editor_write(editor, shown, updated)
        else:
            shown, text, updated, count = await asyncio.to_thread(
                _edit_file, ctx.project_dir, raw_path, old, new, replace_all
            )
        report_diff(ctx.details, shown, text, updated)
        return ToolOutcome(f"Replaced {count} occurrence(s) in {shown}.")


def _replace(text: str, old: str, new: str, replace_all: bool, shown: str) -> tuple[str, int]:
    """``text`` with ``old`` replaced, and how many times it was."""
    count = text.count(old)
    if count == 0:
        raise ToolInputError(f"old_string was not found in {shown}.")
    if count > 1 and not replace_all:
        raise ToolInputError(
            f"old_string occurs {count} times in {shown}; include more surrounding "
            "text to make it unique, or set replace_all."
        )
    if replace_all:
        return text.replace(old, new), count
    return text.replace(old, new, 1), 1


def _edit_file(
    project_dir: Path, raw_path: str, old: str, new: str, replace_all: bool
) -> tuple[str, str, str, int]:
    """The path shown, the text before and after, and the replacements made."""
    root = project_root(project_dir)
    path = resolve_in_project(root, raw_path)
    shown = display_path(root, path)
    if path.is_dir():
        raise ToolInputError(f"{shown} is a directory.")
    try:
        with _open_regular(path, shown) as fh:
            stat = os.fstat(fh.fileno())
            if stat.st_size > MAX_EDIT_FILE_BYTES:
                raise ToolInputError(f"{shown} is too large to edit.")
            text = fh.read().decode("utf-8")
    except FileNotFoundError:
        raise ToolInputError(f"{shown} does not exist.") from None
    except UnicodeDecodeError:
        raise ToolInputError(f"{shown} is not UTF-8 text.") from None
    except OSError as exc:
        raise _os_failure(exc) from None
    updated, count = _replace(text, old, new, replace_all, shown)
    try:
        atomic_write(path, updated.encode("utf-8"), stat.st_mode & 0o7777)
    except OSError as exc:
        raise _os_failure(exc) from None
    return shown, text, updated, count


class ListFiles(BuiltinTool):
    name = "list_files"
    read_only = True
    description = (
        "List project files matching a glob pattern, sorted. '*' stays within a directory, "
        "'**/' spans directories, '{a,b}' alternatives. Directories end with '/'. "
        "path is the directory to search from (default: project root)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Glob, e.g. 'src/**/*.py'."},
            "path": {"type": "string", "description": "Directory relative to the project."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        pattern = require_str(arguments, "pattern")
        validate_glob(pattern)
        raw_path = optional_str(arguments, "path") or "."
        text = await asyncio.to_thread(_list_files, ctx.project_dir, raw_path, pattern)
        return ToolOutcome(text)


def _list_files(project_dir: Path, raw_path: str, pattern: str) -> str:
    root = project_root(project_dir)
    base = resolve_in_project(root, raw_path)
    match = glob_regex(pattern).match
    matches: list[str] = []
    scanned = 0
    # One entry past the bound says whether the scan was complete.
    for path, is_dir in islice(_walk(base, max_depth=glob_depth(pattern)), MAX_SCAN_ENTRIES + 1):
        scanned += 1
        if scanned > MAX_SCAN_ENTRIES:
            break
        if match(path):
            matches.append(path + "/" if is_dir else path)
    # A walk that found nothing may not have had a directory to read.
    if not scanned and not base.is_dir():
        raise ToolInputError(f"{display_path(root, base)} is not a directory.")
    matches.sort()
    lines = matches[:MAX_LIST_RESULTS]
    if not lines:
        lines.append("No files match.")
    if len(matches) > MAX_LIST_RESULTS:
        lines.append(f"[{len(matches) - MAX_LIST_RESULTS} more matches not shown]")
    if scanned > MAX_SCAN_ENTRIES:
        lines.append(f"[scan stopped after {MAX_SCAN_ENTRIES} entries; narrow pattern or path]")
    return "\n".join(lines)


def _walk(base: Path, *, max_depth: int | None = None) -> Iterator[tuple[str, bool]]:
    """The entries under ``base`` as (relative posix path, is a directory), sorted per
    directory: a directory's entries (directories first), then each subdirectory's,
    depth first. Never follows directory symlinks (they are listed, not entered), skips
    ``.git`` and unreadable directories."""
    # (directory, its relative prefix, depth), depth first: children pushed in reverse.
    pending: list[tuple[str, str, int]] = [(os.fspath(base), "", 0)]
    while pending:
        top, prefix, depth = pending.pop()
        dirs: list[str] = []
        files_here: list[str] = []
        links: set[str] = set()  # the subdirectories that are symbolic links
        try:
            with os.scandir(top) as scan:
                for entry in scan:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    if not is_dir:
                        files_here.append(entry.name)
                    elif entry.name not in SKIPPED_DIRS:
                        dirs.append(entry.name)
                        with contextlib.suppress(OSError):
                            if entry.is_symlink():
                                links.add(entry.name)
        except OSError:
            continue
        dirs.sort()
        files_here.sort()
        for name in dirs:
            yield prefix + name, True
        for name in files_here:
            yield prefix + name, False
        if max_depth is None or depth < max_depth:
            pending += [
                (os.path.join(top, name), f"{prefix}{name}/", depth + 1)
                for name in reversed(dirs)
                if name not in links
            ]


class Grep(BuiltinTool):
    name = "grep"
    read_only = True
    description = (
        "Search project files for a Python regular expression, line by line. Prints "
        "'path:line:text'. path is a file or directory (default: project root); glob "
        "filters files (matched against the file name, or the relative path if it "
        "contains '/'). Binary files and .git are skipped."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Python regular expression."},
            "path": {"type": "string", "description": "File or directory in the project."},
            "glob": {"type": "string", "description": "File filter, e.g. '*.py'."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        pattern = require_str(arguments, "pattern")
        raw_path = optional_str(arguments, "path") or "."
        file_glob = optional_str(arguments, "glob")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ToolInputError(f"Invalid regular expression: {exc}.") from None
        if file_glob is not None:
            validate_glob(file_glob)
        candidates = await asyncio.to_thread(_grep_targets, ctx.project_dir, raw_path, file_glob)
        request = {
            "pattern": pattern,
            "candidates": candidates,
            "max_matches": MAX_GREP_MATCHES,
            "max_line_chars": MAX_GREP_LINE_CHARS,
            "max_file_bytes": MAX_GREP_FILE_BYTES,
            "max_total_bytes": MAX_GREP_TOTAL_BYTES,
            "sniff_bytes": BINARY_SNIFF_BYTES,
        }
        try:
            with child_slot(ctx):
                return await _run_grep_worker(json.dumps(request).encode("ascii"))
        except ChildLimitReached as exc:
            raise ToolInputError(str(exc)) from None


def _grep_targets(project_dir: Path, raw_path: str, file_glob: str | None) -> list[tuple[str, str]]:
    """The files to search, confined to the project, in search order: (as shown, path)."""
    root = project_root(project_dir)
    base = resolve_in_project(root, raw_path)
    if base.is_file():
        return [(display_path(root, base), str(base))]
    if base.is_dir():
        return _grep_candidates(root, base, file_glob)
    raise ToolInputError(f"{display_path(root, base)} does not exist.")


async def _run_grep_worker(request: bytes) -> ToolOutcome:
    """Run the search in a worker process; cancellation and the timeout kill it."""
    proc = await asyncio.create_subprocess_exec(
        *GREP_WORKER_COMMAND,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={},  # it needs nothing of anyone's environment
        cwd="/",
    )
    record_child(proc.pid, "worker")
    try:
        async with asyncio.timeout(GREP_TIMEOUT_SECONDS):
            output = await _exchange(proc, request)
            status = await proc.wait()
    except TimeoutError:
        return ToolOutcome.error(
            f"The search did not finish within {GREP_TIMEOUT_SECONDS:g} s (a pattern with "
            "nested repetition can backtrack for very long); simplify the pattern or "
            "narrow path or glob.",
            timed_out=True,
        )
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await shielded(proc.wait())
        forget_child(proc.pid)
    text = _answer(output) if status == 0 else None
    if text is None:
        return ToolOutcome.error("The search failed.")
    return ToolOutcome(text)


def _answer(output: bytes | None) -> str | None:
    if output is None:
        return None
    try:
        text = json.loads(output)
    except ValueError:
        return None
    return text if isinstance(text, str) else None


async def _exchange(proc: asyncio.subprocess.Process, request: bytes) -> bytes | None:
    """Write the request and read the answer (``None`` past its bound) at the same time."""
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def feed() -> None:
        with contextlib.suppress(ConnectionError):
            stdin.write(request)
            await stdin.drain()
            stdin.close()

    feeding = asyncio.create_task(feed())
    try:
        chunks: list[bytes] = []
        size = 0
        while chunk := await stdout.read(65536):
            size += len(chunk)
            if size > MAX_GREP_WORKER_OUTPUT:
                return None
            chunks.append(chunk)
        await feeding
        return b"".join(chunks)
    finally:
        if not feeding.done():
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeding


def _grep_candidates(root: Path, base: Path, file_glob: str | None) -> list[tuple[str, str]]:
    # Strings, not a Path each: pathlib interns every part of a path, and a project's
    # file names all interned at once would have CPython's table of interned strings
    # rebuilt larger, for the daemon's life.
    regex = glob_regex(file_glob) if file_glob else None
    on_name = file_glob is not None and "/" not in file_glob
    shown_base = display_path(root, base)
    prefix = "" if shown_base == "." else f"{shown_base}/"
    found: list[tuple[str, str]] = []
    for relative, is_dir in islice(_walk(base), MAX_SCAN_ENTRIES):
        if is_dir:
            continue
        target = relative.rsplit("/", 1)[-1] if on_name else relative
        if regex is not None and not regex.match(target):
            continue
        found.append((prefix + relative, os.path.join(base, relative)))
    return found
