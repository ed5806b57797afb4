"""``magi-code daemon start|stop|status|run|install``: operator commands.

Messages here are for the operator's terminal and may name files; they never contain
secrets. Exit codes: 0 success; 1 failure; 2 unsafe runtime directory; 3 ``status`` of
a daemon that is not running (and ``run`` when another daemon holds the lock).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Final, TextIO

import orjson

from magi_code.daemon.lifecycle import EXIT_ALREADY_RUNNING, run_daemon
from magi_code.endpoint.lock import is_held
from magi_code.endpoint.paths import UnsafeRuntimeDir, read_info, runtime_paths
from magi_code.protocol.v2 import SUPPORTED_VERSIONS
from magi_code.storage.files import atomic_write
from magi_code.storage.launch import LaunchContext

from .units import enable_instructions, install_target, render_unit

STOP_TIMEOUT_SECONDS: Final = 150.0
EXIT_NOT_RUNNING: Final = 3


def main(ctx: LaunchContext, action: str, *, json: bool, print_unit: bool) -> int:
    try:
        if action == "start":
            return _run(_start(ctx))
        if action == "stop":
            return _run(_stop(ctx))
        if action == "status":
            return _run(_status(ctx, json))
        if action == "install":
            return _install(ctx, print_unit)
    except UnsafeRuntimeDir as exc:
        return _fail(str(exc), 2)
    return _fail(f"unknown daemon command {action!r}; use start, stop, status, run or install")


def run(ctx: LaunchContext, *, on_demand: bool, ready_fd: int | None) -> int:
    code = run_daemon(ctx, on_demand=on_demand, ready_fd=ready_fd)
    if code == EXIT_ALREADY_RUNNING and not on_demand:
        _fail("a daemon is already running for this MC_HOME; stop it with `magi-code daemon stop`")
    return code


def _run(coro: Any) -> int:
    import uvloop

    result: int = uvloop.run(coro)
    return result


def _fail(message: str, code: int = 1, stream: TextIO = sys.stderr) -> int:
    stream.write(f"magi-code: {message}\n")
    return code


async def _start(ctx: LaunchContext) -> int:
    from magi_code.client.starter import DaemonStartError, ensure_daemon

    try:
        await ensure_daemon(ctx)
    except DaemonStartError as exc:
        return _fail(f"cannot start the daemon: {exc}")
    status = await _query(ctx)
    pid = status.get("pid") if status else None
    sys.stdout.write(f"magi-code daemon running (pid {pid})\n")
    return 0


async def _query(ctx: LaunchContext) -> dict[str, Any] | None:
    from magi_code.client import Client, DaemonUnavailable

    try:
        client = await Client.connect(ctx, "control", autostart=False)
    except DaemonUnavailable:
        return None
    try:
        return await asyncio.wait_for(client.control("status"), 10.0)
    finally:
        await client.close()


async def _status(ctx: LaunchContext, as_json: bool) -> int:
    from magi_code.client import DaemonError

    paths = runtime_paths(ctx)
    error = "it does not answer"
    try:
        status = await _query(ctx)
    except (DaemonError, TimeoutError) as exc:
        status, error = None, str(exc)
    if status is None and is_held(paths.lock):
        # Live but not answering (wedged or incompatible): report, never touch it.
        info = read_info(paths) or {}
        status = {
            "running": True,
            "responding": False,
            "pid": info.get("pid"),
            "socket": info.get("socket", str(paths.socket)),
            "version": info.get("version"),
            "protocol_versions": info.get("protocol_versions"),
            "error": error,
        }
    if status is None:
        status = {
            "running": False,
            "pid": None,
            "socket": str(paths.socket),
            "version": None,
            "protocol_versions": list(SUPPORTED_VERSIONS),
        }
    status.setdefault("log", str(paths.log))
    if as_json:
        sys.stdout.write(orjson.dumps(status).decode() + "\n")
    elif status["running"]:
        sys.stdout.write(
            f"magi-code daemon running: pid {status['pid']}, version {status['version']}\n"
            f"  socket:  {status['socket']}\n"
            f"  log:     {status['log']}\n"
            f"  clients: {status.get('clients', '?')}, "
            f"turns: {status.get('active_turns', '?')} "
            f"({status.get('detached_turns', '?')} detached)\n"
        )
        if status.get("responding") is False:
            sys.stdout.write(f"  not answering: {status.get('error')}\n")
    else:
        sys.stdout.write("magi-code daemon not running\n")
    # --json answers in the document (scripts read "running"); text follows LSB status codes.
    return 0 if status["running"] or as_json else EXIT_NOT_RUNNING


async def _stop(ctx: LaunchContext) -> int:
    from magi_code.client import Client, DaemonError, DaemonUnavailable

    paths = runtime_paths(ctx)
    try:
        client = await Client.connect(ctx, "control", autostart=False)
    except DaemonUnavailable:
        if not is_held(paths.lock):
            sys.stdout.write("magi-code daemon not running\n")
            return 0
        client = None
    except DaemonError as exc:
        return _fail(f"cannot stop the daemon: {exc}")
    if client is not None:
        try:
            await client.control("stop")
            # The daemon closes this connection once every turn is drained.
            await asyncio.wait_for(_until_closed(client), STOP_TIMEOUT_SECONDS)
        except (DaemonUnavailable, TimeoutError):
            pass
        finally:
            await client.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_TIMEOUT_SECONDS
    while is_held(paths.lock):
        if loop.time() > deadline:
            info = read_info(paths) or {}
            return _fail(f"the daemon (pid {info.get('pid')}) did not stop in time")
        await asyncio.sleep(0.05)
    sys.stdout.write("magi-code daemon stopped\n")
    return 0


async def _until_closed(client: Any) -> None:
    async for _ in client.events():
        pass


def _install(ctx: LaunchContext, print_only: bool) -> int:
    platform = "darwin" if sys.platform == "darwin" else "linux"
    executable = shutil.which("magi-code", path=ctx.env.get("PATH")) or _sibling_script()
    if executable is None:
        return _fail("cannot find the magi-code executable on PATH")
    _, content = render_unit(platform, os.path.abspath(executable), ctx.mc_home.resolve())
    if print_only:
        sys.stdout.write(content)
        return 0
    home = ctx.env.get("HOME")
    if not home:
        return _fail("HOME is not set; use `magi-code daemon install --print` instead")
    target = install_target(platform, Path(home))
    atomic_write(target, content.encode(), 0o644)
    sys.stdout.write(enable_instructions(platform, target))
    return 0


def _sibling_script() -> str | None:
    candidate = Path(sys.executable).parent / "magi-code"
    return str(candidate) if candidate.exists() else None
