"""Start the daemon on demand: one daemon from any number of concurrent starters.

A starter takes ``start.lock``, retries the connection (someone may have just started
it), and spawns the daemon (``python -m magi_code.daemon``, an on-demand ``daemon run``)
only while nobody holds the lifetime lock; it then waits on a readiness pipe (``READY`` /
``ERR reason`` / EOF) and keeps the start lock until the daemon answers. A live daemon
that does not answer is never killed or unlinked: the starter waits for it while it has
no socket or refuses as ``draining`` (starting or stopping), and reports at once one that
accepts but does not answer its ``hello`` within ``handshake.CONNECT_TIMEOUT`` (stopped
or wedged; ``MC_DAEMON_ANSWER_TIMEOUT_SECONDS`` in the caller's environment overrides it).

:func:`start_daemon` is all of it, blocking, around the caller's own connection (the shim
imports no asyncio for it); :func:`ensure_daemon` runs it from an event loop.

The daemon is spawned directly with exactly its allow-listed environment, so it needs no
re-exec to drop ours (a shell in between would add ``PWD`` and force one). It forks once
and the process we spawned exits at once, so the daemon is not our child (no zombie); it
calls ``setsid`` itself, leaving the frontend's session and process group. Where a
systemd user manager runs, it is also wrapped in ``systemd-run --user --scope`` so it
leaves the frontend's cgroup (a terminal or IDE scope being stopped would kill it).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from magi_code.endpoint.lock import StartLockTimeout, is_held, start_lock
from magi_code.endpoint.paths import ensure_private_dir, runtime_paths
from magi_code.storage.launch import LaunchContext
from magi_code.tools.environment import daemon_environment
from magi_code.version import build_id

from .errors import DaemonError, DaemonTimeout, DaemonUnavailable
from .handshake import answer_timeout

START_TIMEOUT_SECONDS: Final = 30.0
NO_SCOPE_ENV: Final = "MC_DAEMON_NO_SCOPE"
MANAGER_NAMES: Final = frozenset({"NOTIFY_SOCKET", "JOURNAL_STREAM"})

T = TypeVar("T")


class DaemonStartError(Exception):
    """The daemon could not be started; the message names the reason (operator text)."""


class DaemonFailedToStart(DaemonStartError):
    """A daemon was spawned and failed before it was ready. Its reason may name files: it
    is for an operator's terminal (``magi-code daemon start``), not a frontend's stderr."""


async def ensure_daemon(
    ctx: LaunchContext, timeout: float = START_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """Return the ``welcome`` of a daemon for ``ctx.mc_home`` once one answers a control hello.

    :func:`start_daemon` in a worker thread, its hellos on this event loop. Cancelling
    it stops the start at the thread's next step (the start lock is released; a daemon
    already spawned is left to start).
    Raises :class:`DaemonStartError` (one operator line) or ``UnsafeRuntimeDir``.
    """
    import asyncio
    import concurrent.futures
    import threading

    loop = asyncio.get_running_loop()
    cancelled = threading.Event()

    def welcome(build: str | None) -> dict[str, Any]:
        if cancelled.is_set():
            raise DaemonStartError("the start was cancelled")
        future = asyncio.run_coroutine_threadsafe(_welcome(ctx, build), loop)
        try:
            # Bounded: once we are cancelled the loop may stop before it runs the hello.
            return future.result(2 * answer_timeout(ctx.env))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise DaemonStartError("the start was cancelled") from None

    try:
        return await asyncio.to_thread(start_daemon, ctx, welcome, timeout, cancelled)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def start_daemon(
    ctx: LaunchContext,
    connect: Callable[[str | None], T],
    timeout: float = START_TIMEOUT_SECONDS,
    cancelled: threading.Event | None = None,
    *,
    probed: bool = False,
) -> T:
    """Blocking: ``connect(build)`` to this home's daemon, starting one when none answers.

    ``connect`` is the caller's own connection (a control hello, the shim's ``v1_shim``
    one), so what it returns once a daemon answers is what the caller uses; it raises
    ``DaemonUnavailable`` when none listens (or it is draining). With a ``build``, a daemon
    of another build that is idle makes way; once we spawned one, ``build`` is None. Once
    ``cancelled`` is set, the next step raises :class:`DaemonStartError`. ``probed``: the
    caller has just tried ``connect(build_id())``, so only the try under the start lock
    (someone may have started it meanwhile) is repeated.

    Raises :class:`DaemonStartError` (one operator line) or ``UnsafeRuntimeDir``.
    """
    if not probed:
        found = _answer(connect, build_id())
        if found is not None:
            return found
    paths = runtime_paths(ctx)
    ensure_private_dir(paths.state_dir)
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(start_lock(paths.start_lock, timeout))
        except StartLockTimeout as exc:
            raise DaemonStartError(str(exc)) from None
        return _start_locked(ctx, connect, deadline, cancelled or threading.Event())


def _start_locked(
    ctx: LaunchContext,
    connect: Callable[[str | None], T],
    deadline: float,
    cancelled: threading.Event,
) -> T:
    paths = runtime_paths(ctx)
    attempts = 0
    while time.monotonic() < deadline:
        if cancelled.is_set():
            raise DaemonStartError("the start was cancelled")
        # Once we spawned a daemon it runs the files installed now, which may be a newer
        # build than this process loaded: accept it rather than replace it again.
        found = _answer(connect, None if attempts else build_id())
        if found is not None:
            return found
        if is_held(paths.lock):
            time.sleep(0.05)  # starting or draining: never touch it, wait
            continue
        if attempts >= 3:
            break
        use_scope = attempts == 0 and _scope_available(ctx)
        attempts += 1
        reply = _spawn_and_wait(ctx, use_scope, deadline)
        if reply.startswith("ERR ") and not is_held(paths.lock):
            raise DaemonFailedToStart(reply[4:])
        # Else another daemon took the lock first (a service manager restarting it): wait.
    if is_held(paths.lock):
        raise DaemonStartError(
            "a daemon holds the lock for this MC_HOME but does not answer; "
            "check `magi-code daemon status` and its log"
        )
    raise DaemonFailedToStart(f"the daemon did not start; see its log at {paths.log}")


def _answer(connect: Callable[[str | None], T], build: str | None) -> T | None:
    """What ``connect`` returns, or None when no daemon listens (or it is draining).

    Raises :class:`DaemonStartError` for a daemon that listens but does not answer in
    time, and for one that cannot serve us (another user's, another home's).
    """
    try:
        return connect(build)
    except DaemonUnavailable:
        return None
    except DaemonTimeout as exc:
        raise DaemonStartError(
            f"{exc}; a daemon for this MC_HOME is stopped or wedged: "
            "check `magi-code daemon status` and its log"
        ) from None
    except DaemonError as exc:
        raise DaemonStartError(str(exc)) from None


async def _welcome(ctx: LaunchContext, build: str | None) -> dict[str, Any]:
    from .channel import Channel, socket_for

    channel = await Channel.open(
        socket_for(ctx),
        "control",
        ctx,
        timeout=answer_timeout(ctx.env),
        build=build,
    )
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
    # ``magi-code daemon run --on-demand`` without the command line's parser.
    argv = [sys.executable, "-m", "magi_code.daemon", "--ready-fd", str(write_fd)]
    if use_scope:
        argv = ["systemd-run", "--user", "--scope", "--quiet", "--collect", "--", *argv]
    try:
        child = subprocess.Popen(
            argv,
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
    except OSError:
        child = None  # as a daemon that exited silently: the next attempt has no scope
    finally:
        os.close(write_fd)
    try:
        return _read_line(read_fd, deadline) if child is not None else ""
    finally:
        os.close(read_fd)
        if child is not None:
            # It exits as soon as it forked the daemon (or failed before that): reap it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=answer_timeout(ctx.env))


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
