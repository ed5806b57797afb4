"""Drive the real ``magi-code --app service`` process over its stdio pipes.

Every test gets its own temporary MC_HOME and project directory; the process is always
stopped (stdin closed, then killed if it does not exit) when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from magi_code.protocol import envelope
from tests.support.wire_checks import LiveChecks

STEP_TIMEOUT = 20.0

# Captured at import, before the autouse fixture strips MC_* variables; the mode matrix
# fixture (tests/contract, tests/process) overrides it per test.
DEFAULT_MODE = os.environ.get("MC_TEST_SERVICE_MODE", "embedded")
# An installed ``magi-code`` to run instead of ``python -m magi_code`` (``make conformance``).
SERVICE_COMMAND = os.environ.get("MC_TEST_SERVICE_COMMAND")
_mode: list[str] = [DEFAULT_MODE]
_live: dict[Path, int] = {}


def set_mode(mode: str) -> None:
    _mode[0] = mode


def current_mode() -> str:
    return _mode[0]


def stop_daemon(home: Path, timeout: float = 60.0) -> None:
    """Stop the daemon of ``home`` (if any); kill it if it does not stop in time.

    Done in this process over the control protocol (what ``magi-code daemon stop`` does),
    which spares every daemon-mode test an interpreter start at teardown.
    """
    import socket
    import time

    from magi_code.client import socket_for
    from magi_code.endpoint.lock import is_held
    from magi_code.endpoint.paths import runtime_paths
    from magi_code.protocol.frames import encode_frame
    from magi_code.protocol.v2 import Launch, hello
    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext(home, home, service_env(home))
    paths = runtime_paths(ctx)
    if not is_held(paths.lock):
        return
    deadline = time.monotonic() + timeout
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        while True:
            try:
                sock.connect(str(socket_for(ctx)))
                break
            except BlockingIOError:  # a full backlog (a test's burst): it drains in ms
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
        sock.sendall(
            encode_frame(hello("control", Launch(str(home), "", {}), "test-teardown", "0"))
            + encode_frame({"t": "control", "id": 1, "op": "stop"})
        )
        while sock.recv(65536):  # the daemon closes this connection once it has drained
            pass
    while is_held(paths.lock) and time.monotonic() < deadline:
        time.sleep(0.02)
    kill_leftover_daemon(home)


def stop_daemons(root: Path) -> None:
    """Stop the daemon of every ``mc-home*`` directory under ``root`` (a test's tmp_path)."""
    for home in root.glob("mc-home*"):
        stop_daemon(home)


def kill_leftover_daemon(home: Path) -> None:
    """Last resort at teardown: SIGKILL the daemon recorded for ``home`` if it still runs."""
    import signal

    from magi_code.endpoint.lock import is_held
    from magi_code.endpoint.paths import read_info, runtime_paths
    from magi_code.storage.launch import LaunchContext

    paths = runtime_paths(LaunchContext(home, home, service_env(home)))
    if not is_held(paths.lock):
        return
    info = read_info(paths) or {}
    pid = info.get("pid")
    if isinstance(pid, int):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def service_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MC_", "ANTHROPIC_", "OPENAI_", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME"))
        and k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")
        and not k.upper().endswith("_PROXY")
        and not k.upper().startswith("SSL_CERT_")
    }
    env["MC_HOME"] = str(home)
    env["HOME"] = str(home.parent / "user-home")
    env["MC_SERVICE_MODE"] = current_mode()
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


async def spawn(
    project: Path,
    env: Mapping[str, str],
    args: tuple[str, ...] = ("--app", "service"),
    *,
    python: str | None = None,
    umask: int = -1,
) -> asyncio.subprocess.Process:
    """``python -m magi_code ARGS`` (this interpreter unless ``python`` names another), or
    the ``MC_TEST_SERVICE_COMMAND`` this run was given, on pipes, in ``project``, with
    exactly ``env`` (and ``umask``, as Popen's, when given)."""
    if python is None and SERVICE_COMMAND:
        command = [SERVICE_COMMAND, *args]
    else:
        command = [python or sys.executable, "-m", "magi_code", *args]
    # Only when given: uvloop (the benchmarks' loop) takes no ``umask``.
    extra: dict[str, Any] = {"umask": umask} if umask != -1 else {}
    return await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=project,
        env=dict(env),
        limit=1 << 20,
        **extra,
    )


class ServiceProcess:
    def __init__(
        self, proc: asyncio.subprocess.Process, home: Path, mode: str, *, checks: bool = True
    ) -> None:
        self.proc = proc
        self.home = home
        self.mode = mode
        self._counted = True
        _live[home] = _live.get(home, 0) + 1
        self._ids = itertools.count(1)
        self.pending: list[dict[str, Any]] = []
        # The reference consumer and the JSON Schemas check every record written and read
        # (benchmarks turn this off: it would be most of what they measure).
        self.checks = LiveChecks() if checks else None

    @classmethod
    async def start(
        cls,
        home: Path,
        project: Path,
        env: Mapping[str, str] | None = None,
        args: tuple[str, ...] = ("--app", "service"),
        *,
        checks: bool = True,
        python: str | None = None,
    ) -> ServiceProcess:
        """:func:`spawn` with this home's test environment (``service_env``)."""
        proc = await spawn(project, service_env(home, env), args, python=python)
        mode = (env or {}).get("MC_SERVICE_MODE", current_mode())
        return cls(proc, home, mode, checks=checks)

    async def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        if self.checks is not None:
            self.checks.sent(data)
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def send(self, record: Mapping[str, Any]) -> None:
        await self.send_raw(orjson.dumps(record) + b"\n")

    def next_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._ids)}"

    async def recv(self, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
        """Next message, from what was buffered while waiting for responses, or the pipe."""
        if self.pending:
            return self.pending.pop(0)
        return await self._read(timeout)

    async def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise EOFError("service closed stdout")
        assert line.endswith(b"\n")
        if self.checks is None:
            message: dict[str, Any] = orjson.loads(line)
            return message
        return self.checks.received(line)

    async def request(
        self,
        method: str,
        payload: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        timeout: float = STEP_TIMEOUT,
    ) -> dict[str, Any]:
        """Send one request and return its response; events seen meanwhile stay queued."""
        rid = request_id or self.next_id()
        record = envelope.request(rid, method, payload, session_id)
        await self.send(record)
        return await self.response_for(rid, timeout)

    async def response_for(self, request_id: str, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
        for i, message in enumerate(self.pending):
            if message["kind"] == "response" and message["request_id"] == request_id:
                return self.pending.pop(i)
        while True:
            message = await self._read(timeout)
            if message["kind"] == "response" and message["request_id"] == request_id:
                return message
            self.pending.append(message)

    async def initialize(self) -> dict[str, Any]:
        response = await self.request("initialize", {"supported_protocol_versions": [1]})
        assert response["error"] is None, response
        return response

    async def events_until_terminal(
        self, request_id: str, terminal: str = "turn.terminal", timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Collect every event correlated to ``request_id`` up to and including its terminal."""
        events: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            message = None
            for i, candidate in enumerate(self.pending):
                if candidate["kind"] == "event" and candidate["request_id"] == request_id:
                    message = self.pending.pop(i)
                    break
            if message is None:
                message = await self._read(max(0.1, deadline - loop.time()))
                if message["kind"] != "event" or message["request_id"] != request_id:
                    self.pending.append(message)
                    continue
            events.append(message)
            if message["event"] == terminal:
                return events

    async def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        if self.checks is not None:
            self.checks.sent_eof()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.proc.stdin.close()
            await self.proc.stdin.wait_closed()

    async def drain_stdout(self, timeout: float = STEP_TIMEOUT) -> list[dict[str, Any]]:
        """Everything left on stdout until EOF (after stdin was closed)."""
        messages = list(self.pending)
        self.pending.clear()
        with contextlib.suppress(EOFError):
            while True:
                messages.append(await self._read(timeout))
        return messages

    async def wait(self, timeout: float = STEP_TIMEOUT) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stderr_text(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode(errors="replace")

    async def stop(self) -> None:
        if self.proc.returncode is None:
            await self.close_stdin()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._counted and self.home in _live:
            self._counted = False
            _live[self.home] -= 1
            if _live[self.home] <= 0:
                del _live[self.home]
                if self.mode == "daemon":
                    # No daemon outlives the last service process of its test home.
                    await asyncio.to_thread(stop_daemon, self.home)


@contextlib.asynccontextmanager
async def running_service(
    home: Path, project: Path, env: Mapping[str, str] | None = None, *, initialize: bool = True
) -> AsyncIterator[ServiceProcess]:
    service = await ServiceProcess.start(home, project, env)
    try:
        if initialize:
            await service.initialize()
        yield service
    finally:
        await service.stop()
