"""The shell tool: ``/bin/sh -c`` in the project directory, in its own process group.

The command runs in a new session (``start_new_session=True``) so the whole tree it
starts shares one process group. When the command finishes, times out or the call is
cancelled, that group is terminated (SIGTERM, then SIGKILL after a short grace) and the
shell is reaped, so a tool call never leaves processes behind. Background jobs therefore
end with the command; a process that starts its own session (``setsid``) escapes the
group and is not tracked (but see ``tools.sandbox``: in the sandbox it dies with the
command, and the daemon, a subreaper, kills what is left when it stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.tools.base import (
    MAX_OUTPUT_BYTES,
    BuiltinTool,
    ToolContext,
    ToolInputError,
    ToolOutcome,
    bound_text,
    require_str,
    shielded,
)
from magi_code.tools.environment import child_environment
from magi_code.tools.paths import project_root
from magi_code.tools.processes import (
    ChildKind,
    ChildLimitReached,
    child_slot,
    forget_child,
    record_child,
    terminate_process_group,
    under_umask,
)
from magi_code.tools.sandbox import Sandbox

SHELL: Final = "/bin/sh"
DEFAULT_TIMEOUT_SECONDS: Final = 120.0
MAX_TIMEOUT_SECONDS: Final = 600.0
# Head and tail of the combined stdout/stderr are kept: errors tend to be at the end.
HEAD_BYTES: Final = 14 * 1024
TAIL_BYTES: Final = 14 * 1024
# How long the shell may take to be reaped once its group is gone.
REAP_GRACE_SECONDS: Final = 2.0
# How long output may keep arriving after the group is gone (pipe buffers, slow reads).
PIPE_GRACE_SECONDS: Final = 2.0


class _Capture:
    """Bounded capture of a byte stream: the first and last bytes, with the gap counted."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._tail = bytearray()
        self._omitted = 0

    def feed(self, data: bytes) -> None:
        room = HEAD_BYTES - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail += data
        excess = len(self._tail) - TAIL_BYTES
        if excess > 0:
            self._omitted += excess
            del self._tail[:excess]

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if self._omitted:
            return f"{head}\n[output truncated: {self._omitted} bytes omitted]\n{tail}"
        return head + tail


class _ShellProtocol(asyncio.SubprocessProtocol):
    def __init__(self, capture: _Capture) -> None:
        self._capture = capture
        self.exited = asyncio.Event()
        self.output_closed = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._capture.feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.output_closed.set()

    def process_exited(self) -> None:
        self.exited.set()


@dataclass(frozen=True, slots=True)
class ShellResult:
    output: str
    returncode: int | None
    timed_out: bool


async def run_shell(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    umask: int | None = None,
    kind: ChildKind = "tool",
    sandbox: Sandbox | None = None,
    stdin: int | None = None,
    owner: object | None = None,
) -> ShellResult:
    """Run ``command`` and return its bounded output; the process group never outlives this.

    ``umask`` is the shell's file-mode creation mask (``None``: this process's own);
    ``kind`` is what the shell is recorded as while it lives (``daemon status``).
    ``sandbox`` confines it with ``cwd`` (resolved) as the writable project
    (``tools.sandbox``); ``stdin`` is a file descriptor to read from (default: none);
    ``owner`` is the turn whose child slot it takes (``processes.child_slot``).

    Raises:
        ChildLimitReached: no child slot is free; nothing was started.
        OSError: the shell could not be started.
        ValueError: the command contains a NUL byte.
        asyncio.CancelledError: after the process group has been killed and reaped.
    """
    with child_slot(owner):
        return await _run_shell(
            command,
            cwd=cwd,
            env=env,
            timeout=timeout,
            umask=umask,
            kind=kind,
            sandbox=sandbox,
            stdin=stdin,
        )


async def _run_shell(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    umask: int | None,
    kind: ChildKind,
    sandbox: Sandbox | None,
    stdin: int | None,
) -> ShellResult:
    loop = asyncio.get_running_loop()
    capture = _Capture()
    argv = [SHELL, "-c", command]
    if sandbox is not None:
        argv = sandbox.wrap(argv, str(cwd))
    # The spawn is shielded so a cancellation landing mid-spawn still finds the
    # transport below and kills the group, instead of asyncio killing only the shell.
    spawn = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: _ShellProtocol(capture),
            *under_umask(argv, umask),
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    )
    timed_out = False
    try:
        transport, protocol = await asyncio.shield(spawn)
        record_child(transport.get_pid(), kind)
        try:
            async with asyncio.timeout(timeout):
                await protocol.exited.wait()
        except TimeoutError:
            timed_out = True
    finally:
        await shielded(_cleanup(spawn))
    return ShellResult(capture.text(), transport.get_returncode(), timed_out)


async def _cleanup(
    spawn: asyncio.Future[tuple[asyncio.SubprocessTransport, _ShellProtocol]],
) -> None:
    try:
        transport, protocol = await spawn
    except (OSError, ValueError):
        return  # nothing was started
    try:
        await terminate_process_group(transport.get_pid())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REAP_GRACE_SECONDS):
                await protocol.exited.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PIPE_GRACE_SECONDS):
                await protocol.output_closed.wait()
    finally:
        forget_child(transport.get_pid())
        transport.close()


def _timeout_argument(arguments: Mapping[str, object]) -> float:
    value = arguments.get("timeout_seconds")
    if value is None:
        return DEFAULT_TIMEOUT_SECONDS
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolInputError("'timeout_seconds' must be a number.")
    if not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise ToolInputError(
            f"'timeout_seconds' must be above 0 and at most {MAX_TIMEOUT_SECONDS:g}."
        )
    return float(value)


def _status_line(result: ShellResult, timeout: float) -> str:
    if result.timed_out:
        return f"[timed out after {timeout:g} s; the command's processes were killed]"
    if result.returncode is None:
        return "[exit status unknown]"
    if result.returncode < 0:
        return f"[terminated by signal {-result.returncode}]"
    return f"[exit code {result.returncode}]"


class Shell(BuiltinTool):
    name = "shell"
    description = (
        "Run a command with /bin/sh -c in the project directory. stdout and stderr are "
        "combined; the exit code is reported. The command and everything it starts is "
        f"killed after timeout_seconds (default {DEFAULT_TIMEOUT_SECONDS:g}, max "
        f"{MAX_TIMEOUT_SECONDS:g}) and when it finishes, so background jobs do not persist."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Shell command line."},
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_TIMEOUT_SECONDS,
                "description": "Time limit in seconds.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    async def execute(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        command = require_str(arguments, "command")
        timeout = _timeout_argument(arguments)
        cwd = await asyncio.to_thread(project_root, ctx.project_dir)
        env = child_environment(ctx.env, secret_names=ctx.secret_names)
        try:
            result = await run_shell(
                command,
                cwd=cwd,
                env=env,
                timeout=timeout,
                umask=ctx.umask,
                sandbox=ctx.sandbox,
                owner=ctx,
            )
        except ChildLimitReached as exc:
            raise ToolInputError(str(exc)) from None
        except ValueError:
            raise ToolInputError("The command must not contain NUL bytes.") from None
        except OSError as exc:
            raise ToolInputError(
                f"The command could not be started: {exc.strerror or 'OS error'}."
            ) from None
        # Room is kept for the status line: invalid UTF-8 can grow in decoding.
        body = bound_text(result.output.rstrip("\n"), MAX_OUTPUT_BYTES - 256)
        status = _status_line(result, timeout)
        return ToolOutcome(
            output=f"{body}\n{status}" if body else status,
            is_error=result.timed_out or result.returncode != 0,
            timed_out=result.timed_out,
        )
