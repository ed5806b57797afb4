"""Start the daemon on demand: one daemon from any number of concurrent starters.

A starter takes ``start.lock``, retries the connection (someone may have just started
it), and spawns ``magi-code daemon run --on-demand`` only while nobody holds the lifetime
lock; it then waits on a readiness pipe (``READY`` / ``ERR reason`` / EOF) and keeps the
start lock until the daemon answers. A live daemon that does not answer is never killed
or unlinked: the starter waits for it while it has no socket or refuses as ``draining``
(starting or stopping), and reports at once one that accepts but does not answer its
``hello`` within :data:`ANSWER_TIMEOUT_SECONDS` (stopped or wedged).

The daemon is spawned through ``/bin/sh -c '... &'`` so it is not our child (no zombie),
and it calls ``setsid`` itself, leaving the frontend's session and process group. Where
a systemd user manager runs, it is also wrapped in ``systemd-run --user --scope`` so it
leaves the frontend's cgroup (a terminal or IDE scope being stopped would kill it).
"""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from magi_code.endpoint.lock import StartLockTimeout, is_held, start_lock
from magi_code.endpoint.paths import ensure_private_dir, runtime_paths
from magi_code.storage.launch import LaunchContext
from magi_code.tools.environment import daemon_environment
from magi_code.version import build_id

from .channel import Channel, socket_for
from .errors import DaemonError, DaemonTimeout, DaemonUnavailable

START_TIMEOUT_SECONDS: Final = 30.0
# A daemon that accepted the connection answers hello in milliseconds.
ANSWER_TIMEOUT_SECONDS: Final = 3.0
NO_SCOPE_ENV: Final = "MC_DAEMON_NO_SCOPE"
MANAGER_NAMES: Final = frozenset({"NOTIFY_SOCKET", "JOURNAL_STREAM"})


class DaemonStartError(Exception):
    """The daemon could not be started; the message names the reason (operator text)."""


async def ensure_daemon(
    ctx: LaunchContext, timeout: float = START_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """Return the ``welcome`` of a daemon for ``ctx.mc_home`` once one answers a control hello.

    Raises :class:`DaemonStartError` (one operator line) or ``UnsafeRuntimeDir``.
    """
    welcome = await _answers(ctx, build_id())
    if welcome is not None:
        return welcome
    paths = runtime_paths(ctx)
    await asyncio.to_thread(ensure_private_dir, paths.state_dir)
    deadline = time.monotonic() + timeout
    # The start lock is a blocking flock: hold it in a worker thread for the whole start.
    acquired: asyncio.Event = asyncio.Event()
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def hold() -> None:
        with start_lock(paths.start_lock, timeout):
            loop.call_soon_threadsafe(acquired.set)
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result()

    holder = asyncio.ensure_future(asyncio.to_thread(hold))
    try:
        waiter = asyncio.ensure_future(acquired.wait())
        await asyncio.wait({waiter, holder}, return_when=asyncio.FIRST_COMPLETED)
        if holder.done():
            waiter.cancel()
            try:
                holder.result()
            except StartLockTimeout as exc:
                raise DaemonStartError(str(exc)) from None
        return await _start_locked(ctx, deadline)
    except (DaemonUnavailable, DaemonError) as exc:
        raise DaemonStartError(str(exc)) from None
    finally:
        release.set()
        if not holder.done():
            await holder


async def _start_locked(ctx: LaunchContext, deadline: float) -> dict[str, Any]:
    paths = runtime_paths(ctx)
    attempts = 0
    while time.monotonic() < deadline:
        # Once we spawned a daemon it runs the files installed now, which may be a newer
        # build than this process loaded: accept it rather than replace it again.
        welcome = await _answers(ctx, None if attempts else build_id())
        if welcome is not None:
            return welcome
        if await asyncio.to_thread(is_held, paths.lock):
            await asyncio.sleep(0.05)  # starting or draining: never touch it, wait
            continue
        if attempts >= 3:
            break
        use_scope = attempts == 0 and _scope_available(ctx)
        attempts += 1
        reply = await asyncio.to_thread(_spawn_and_wait, ctx, use_scope, deadline)
        if reply.startswith("ERR ") and not await asyncio.to_thread(is_held, paths.lock):
            raise DaemonStartError(reply[4:])
        # Else another daemon took the lock first (a service manager restarting it): wait.
    if await asyncio.to_thread(is_held, paths.lock):
        raise DaemonStartError(
            "a daemon holds the lock for this MC_HOME but does not answer; "
            "check `magi-code daemon status` and its log"
        )
    raise DaemonStartError(f"the daemon did not start; see its log at {paths.log}")


async def _answers(ctx: LaunchContext, build: str | None) -> dict[str, Any] | None:
    """The welcome of this home's daemon, or None when none listens (or it is draining).

    With ``build``, a daemon of another build that is idle stops for us (None).

    Raises :class:`DaemonStartError` for a daemon that listens but does not answer in
    time, and for one that cannot serve us (another user's, another home's).
    """
    try:
        channel = await Channel.open(
            socket_for(ctx), "control", ctx, timeout=ANSWER_TIMEOUT_SECONDS, build=build
        )
    except DaemonUnavailable:
        return None
    except DaemonTimeout as exc:
        raise DaemonStartError(
            f"{exc}; a daemon for this MC_HOME is stopped or wedged: "
            "check `magi-code daemon status` and its log"
        ) from None
    except DaemonError as exc:
        raise DaemonStartError(str(exc)) from None
    await channel.close()
    return channel.welcome


def _scope_available(ctx: LaunchContext) -> bool:
    if ctx.env.get(NO_SCOPE_ENV) or not sys.platform.startswith("linux"):
        return False
    runtime = ctx.env.get("XDG_RUNTIME_DIR")
    if not runtime or shutil.which("systemd-run", path=ctx.env.get("PATH")) is None:
        return False
    return (Path(runtime) / "systemd" / "private").exists()


def _spawn_and_wait(ctx: LaunchContext, use_scope: bool, deadline: float) -> str:
    """Spawn a detached daemon; return its readiness line ("" when it exited silently)."""
    read_fd, write_fd = os.pipe()
    argv = [
        sys.executable,
        "-m",
        "magi_code",
        "daemon",
        "run",
        "--on-demand",
        "--ready-fd",
        str(write_fd),
    ]
    if use_scope:
        argv = ["systemd-run", "--user", "--scope", "--quiet", "--collect", "--", *argv]
    try:
        shell = subprocess.Popen(
            ["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", *argv],
            pass_fds=(write_fd,),
            start_new_session=True,
            cwd="/",
            # Only what the daemon keeps: no provider keys ever reach its environment,
            # and no service manager's channels (this daemon is not the manager's).
            env={
                name: value
                for name, value in daemon_environment(ctx.env).items()
                if name not in MANAGER_NAMES
            },
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shell.wait()
    finally:
        os.close(write_fd)
    try:
        return _read_line(read_fd, deadline)
    finally:
        os.close(read_fd)


def _read_line(fd: int, deadline: float) -> str:
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 1024)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()
