"""``magi-code daemon run``: process setup around :class:`~magi_code.daemon.server.DaemonServer`.

Order (each step only after the previous one succeeded): the environment scrubbed to the
daemon's allow-list (re-exec'ing once when the starter passed more, see
:func:`_scrub_environment`); umask 077; private state and
socket directories; the log; the lifetime lock (waiting a bounded time for a draining
predecessor); only then remove a stale socket and bind ours (0600, under umask 0177);
``daemon.json``; serve; on exit remove the socket only if it is still ours, and release the
lock last. A process that cannot take the lock exits :data:`EXIT_ALREADY_RUNNING` without
touching the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import logging.handlers
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Final

import orjson

from magi_code.endpoint.lock import (
    LifetimeLock,
    remove_own_socket,
    remove_stale_socket,
    socket_identity,
)
from magi_code.endpoint.paths import (
    RuntimePaths,
    UnsafeRuntimeDir,
    ensure_private_dir,
    runtime_paths,
)
from magi_code.protocol.v2 import SUPPORTED_VERSIONS
from magi_code.storage.files import atomic_write
from magi_code.storage.launch import LaunchContext
from magi_code.tools.environment import daemon_environment
from magi_code.version import package_version

from .outbound import DEFAULT_LIMIT_BYTES, MIN_LIMIT_BYTES

EXIT_ALREADY_RUNNING: Final = 3
EXIT_UNSAFE: Final = 2
IDLE_ENV: Final = "MC_DAEMON_IDLE_SECONDS"
OUTBOUND_ENV: Final = "MC_DAEMON_OUTBOUND_BYTES"
# Set to our pid across the one re-exec that drops the starter's environment.
REEXEC_ENV: Final = "MC_DAEMON_REEXEC"
DEFAULT_ON_DEMAND_IDLE_SECONDS: Final = 60.0
LOCK_WAIT_SECONDS: Final = 10.0
LOG_MAX_BYTES: Final = 1024 * 1024
LOG_BACKUPS: Final = 3

log = logging.getLogger("magi_code.daemon")


def idle_seconds(ctx: LaunchContext, on_demand: bool) -> float | None:
    """``MC_DAEMON_IDLE_SECONDS`` (0 disables); else 60 s on demand, off in the foreground."""
    raw = ctx.env.get(IDLE_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = DEFAULT_ON_DEMAND_IDLE_SECONDS
        return value if value > 0 else None
    return DEFAULT_ON_DEMAND_IDLE_SECONDS if on_demand else None


def outbound_limit(ctx: LaunchContext) -> int:
    """``MC_DAEMON_OUTBOUND_BYTES``: a persistent connection's outbound queue bound."""
    raw = ctx.env.get(OUTBOUND_ENV, "")
    return max(MIN_LIMIT_BYTES, int(raw)) if raw.isdigit() else DEFAULT_LIMIT_BYTES


def run_daemon(ctx: LaunchContext, *, on_demand: bool, ready_fd: int | None = None) -> int:
    """Run the daemon in this process until it stops; returns the exit code."""
    try:
        ctx = _scrub_environment(ctx, ready_fd)
    except OSError as exc:
        _ReadyPipe(ready_fd).fail(f"cannot drop the starter's environment: {exc.strerror}")
        return EXIT_UNSAFE
    os.umask(0o077)
    if on_demand:
        _detach_from_caller()
    ready = _ReadyPipe(ready_fd)
    try:
        paths = runtime_paths(ctx)
        ensure_private_dir(paths.state_dir)
        ensure_private_dir(paths.socket_dir)
    except UnsafeRuntimeDir as exc:
        ready.fail(str(exc))
        return EXIT_UNSAFE
    _setup_logging(paths.log)
    lock = _acquire(paths.lock, LOCK_WAIT_SECONDS if on_demand else 0.0)
    if lock is None:
        log.info("another daemon holds the lifetime lock")
        ready.fail("a daemon is already running for this MC_HOME")
        return EXIT_ALREADY_RUNNING
    identity = None
    try:
        remove_stale_socket(paths.socket, lock)
        sock = _bind(paths.socket)
        identity = socket_identity(paths.socket)
        _write_info(paths)
        return _serve(ctx, paths, lock, sock, on_demand, ready, identity)
    except (UnsafeRuntimeDir, OSError) as exc:
        log.error("startup failed (%s)", type(exc).__name__)
        ready.fail(str(exc))
        return EXIT_UNSAFE
    finally:
        if identity is not None:
            remove_own_socket(paths.socket, lock, identity)
        lock.release()
        log.info("exited")


def _serve(
    ctx: LaunchContext,
    paths: RuntimePaths,
    lock: LifetimeLock,
    sock: socket.socket,
    on_demand: bool,
    ready: _ReadyPipe,
    identity: object,
) -> int:
    import uvloop

    from magi_code.composition import build_coordinator

    from .server import DaemonServer

    def self_check() -> bool:
        return lock.still_owns_path() and socket_identity(paths.socket) == identity

    async def main() -> None:
        coordinator = await build_coordinator(ctx, ("unix",))
        server = DaemonServer(
            coordinator,
            mc_home=ctx.mc_home,
            socket_path=paths.socket,
            version=package_version(),
            idle_seconds=idle_seconds(ctx, on_demand),
            mode="on_demand" if on_demand else "foreground",
            self_check=self_check,
            outbound_limit=outbound_limit(ctx),
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.request_stop, "signal")
        await server.serve(sock, ready.ok)

    uvloop.run(main())
    return 0


def _scrub_environment(ctx: LaunchContext, ready_fd: int | None) -> LaunchContext:
    """Keep only the daemon's allow-list of its starter's environment, for its whole life.

    Clients bring their own environment with each connection; the daemon's would only
    expose what its first starter had (API keys, tokens) to every later client's tools.
    ``/proc/<pid>/environ`` shows the environment a process was exec'd with, so when the
    starter passed anything else this re-execs the same command line (same pid, the
    readiness pipe kept open) with the allow-list, once. Raises ``OSError`` when the
    re-exec fails.
    """
    clean = daemon_environment(os.environ)
    reexecuted = clean.pop(REEXEC_ENV, None) == str(os.getpid())
    if not reexecuted and clean.keys() != os.environ.keys():
        if ready_fd is not None:
            os.set_inheritable(ready_fd, True)
        os.execve(sys.executable, sys.orig_argv, {**clean, REEXEC_ENV: str(os.getpid())})
    for name in [name for name in os.environ if name not in clean]:
        del os.environ[name]  # the marker, or anything the platform added after exec
    return dataclasses.replace(ctx, env=clean)


def _detach_from_caller() -> None:
    # Own session and process group: the frontend's terminal or group kill does not reach us.
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.chdir("/")


def _acquire(path: Path, wait: float) -> LifetimeLock | None:
    deadline = time.monotonic() + wait
    while True:
        lock = LifetimeLock.acquire(path)
        if lock is not None or time.monotonic() >= deadline:
            return lock
        time.sleep(0.05)


def _bind(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(0o177)  # no window where the socket is wider than 0600
        try:
            sock.bind(os.fspath(path))
        finally:
            os.umask(previous)
        os.chmod(path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _write_info(paths: RuntimePaths) -> None:
    info = {
        "pid": os.getpid(),
        "version": package_version(),
        "socket": str(paths.socket),
        "protocol_versions": list(SUPPORTED_VERSIONS),
        "started_at": int(time.time()),
    }
    atomic_write(paths.info, orjson.dumps(info), 0o600)


def _setup_logging(path: Path) -> None:
    # Event names and codes only: never environments, request data or provider text. In
    # the foreground the CLI's stderr handler stays too (the journal under systemd).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS
    )
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s [{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    )
    logging.getLogger().addHandler(handler)
    # Our own lifecycle events at INFO; everything else (httpx logs URLs) stays at WARNING.
    log.setLevel(logging.INFO)


class _ReadyPipe:
    """The starter's readiness pipe: ``READY`` or ``ERR <reason>``, then closed."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def ok(self) -> None:
        self._send(b"READY\n")

    def fail(self, reason: str) -> None:
        self._send(f"ERR {reason}".replace("\n", " ").encode()[:1000] + b"\n")

    def _send(self, data: bytes) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(fd, data)
        with contextlib.suppress(OSError):
            os.close(fd)
