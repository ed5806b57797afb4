"""``magi-code daemon run``: process setup around :class:`~magi_code.daemon.server.DaemonServer`.

Order (each step only after the previous one succeeded): the environment scrubbed to the
daemon's allow-list (re-exec'ing once when the starter passed more, see
:func:`_scrub_environment`); umask 077; private state and
socket directories; the log (``daemon.log``, or the journal alone when systemd runs the
daemon); the lifetime lock (waiting a bounded time for a draining
predecessor); the coordinator; only then remove a stale socket and bind ours (0600, under
umask 0177), so a socket that accepts always answers at once; ``daemon.json``; serve; on
exit remove the socket only if it is still ours (and this home's own socket directory once
empty), and release the lock last. A daemon a
service manager started tells it ``READY=1`` when it serves and ``STOPPING=1`` when it
decides to stop (``notify.py``, ``supervised.py``). A process that
cannot take the lock exits :data:`EXIT_ALREADY_RUNNING` without touching the socket.

:class:`SocketKeeper` is the only code that creates or removes the socket: it touches only
this ``MC_HOME``'s path, only under the lock, never a socket some live process listens on,
and re-binds the path while serving when the file was deleted or replaced (see
``server.py``). Failures before serving are one line: on the readiness pipe, or on stderr
in the foreground.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import io
import logging
import logging.handlers
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Final, Literal

import orjson

from magi_code import logs
from magi_code.core.handover import DEFAULT_TIMEOUT_SECONDS as DEFAULT_CONTROL_REQUEST_SECONDS
from magi_code.durations import seconds_from
from magi_code.endpoint.lock import (
    FileIdentity,
    LifetimeLock,
    bind_socket,
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
from magi_code.storage.files import atomic_write, open_regular
from magi_code.storage.launch import LaunchContext
from magi_code.tools.environment import daemon_environment
from magi_code.version import build_id, package_version

from .exits import EXIT_ALREADY_RUNNING, EXIT_RESTART, EXIT_UNSAFE
from .notify import NOTIFY_ENV, Notifier, stderr_is_journal
from .outbound import CLIENT_TIMEOUT_SECONDS, DEFAULT_LIMIT_BYTES, MIN_LIMIT_BYTES

RESTART_REASONS: Final = frozenset({"upgrade", "restart"})
IDLE_ENV: Final = "MC_DAEMON_IDLE_SECONDS"
OUTBOUND_ENV: Final = "MC_DAEMON_OUTBOUND_BYTES"
CLIENT_TIMEOUT_ENV: Final = "MC_DAEMON_CLIENT_TIMEOUT_SECONDS"
CONTROL_REQUEST_ENV: Final = "MC_DAEMON_CONTROL_REQUEST_SECONDS"
FD_LIMIT: Final = 65536
# Set to our pid across the one re-exec that drops the starter's environment.
REEXEC_ENV: Final = "MC_DAEMON_REEXEC"
DEFAULT_ON_DEMAND_IDLE_SECONDS: Final = 60.0
LOCK_WAIT_SECONDS: Final = 10.0
LOG_BYTES_ENV: Final = "MC_DAEMON_LOG_BYTES"
LOG_MAX_BYTES: Final = 1024 * 1024
LOG_MIN_BYTES: Final = 4096
LOG_BACKUPS: Final = 3
# The starter's client connects and initializes within milliseconds of READY: it is
# answered first, then the HTTP stack of turns is loaded (~30 ms, see preload.py) and the
# bundled CA roots (in a worker thread).
WARM_AFTER_READY_SECONDS: Final = 0.05

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


def client_timeout(ctx: LaunchContext) -> float:
    """``MC_DAEMON_CLIENT_TIMEOUT_SECONDS``: how long a client may leave output unread."""
    return seconds_from(ctx.env, CLIENT_TIMEOUT_ENV, CLIENT_TIMEOUT_SECONDS)


def control_request_timeout(ctx: LaunchContext) -> float:
    """``MC_DAEMON_CONTROL_REQUEST_SECONDS``: how long a ``control_request`` waits for the
    controller's answer before it is granted (once no turn runs)."""
    return seconds_from(ctx.env, CONTROL_REQUEST_ENV, DEFAULT_CONTROL_REQUEST_SECONDS)


def raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one: the limit of whichever client
    started the daemon (often 256 or 1024) must not cap how many clients it serves."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_daemon(ctx: LaunchContext, *, on_demand: bool, ready_fd: int | None = None) -> int:
    """Run the daemon in this process until it stops; returns the exit code."""
    try:
        ctx = _scrub_environment(ctx, ready_fd)
    except OSError as exc:
        _ReadyPipe(ready_fd).fail(f"cannot drop the starter's environment: {exc.strerror}")
        return EXIT_UNSAFE
    # Only a daemon its service manager started talks to it (an on-demand one may have
    # inherited a frontend's manager variables); no child of ours inherits its socket.
    notifier = Notifier(None) if on_demand else Notifier.from_environment(ctx.env)
    journal = not on_demand and stderr_is_journal(ctx.env)
    os.environ.pop(NOTIFY_ENV, None)
    os.umask(0o077)
    raise_fd_limit()
    ready = _ReadyPipe(ready_fd)
    try:
        if on_demand:
            _detach_from_caller()
        paths = runtime_paths(ctx)
        ensure_private_dir(paths.state_dir)
        ensure_private_dir(paths.socket_dir)
        _setup_logging(paths.log, journal=journal, max_bytes=log_max_bytes(ctx))
        lock = _acquire(paths.lock, LOCK_WAIT_SECONDS if on_demand else 0.0)
    except (UnsafeRuntimeDir, OSError) as exc:  # e.g. a read-only MC_HOME
        ready.fail(_describe(exc))
        return EXIT_UNSAFE
    if lock is None:
        log.info("another daemon holds the lifetime lock")
        ready.fail(
            "a daemon is already running for this MC_HOME; stop it with `magi-code daemon stop`"
        )
        return EXIT_ALREADY_RUNNING
    keeper = SocketKeeper(ctx, paths, lock)
    ready.under_lock = True
    try:
        return _serve(ctx, keeper, on_demand, ready, notifier, journal)
    except (UnsafeRuntimeDir, OSError) as exc:
        log.error("startup failed (%s)", type(exc).__name__)
        ready.fail(_describe(exc))
        return EXIT_UNSAFE
    finally:
        keeper.close()
        lock.release()
        ready.lock_released()
        log.info("exited")


class SocketKeeper:
    """This home's socket path under its lifetime lock: bind, self-check, re-bind, remove.

    The :class:`~magi_code.daemon.server.Endpoint` of the running daemon. ``check`` is two
    ``stat`` calls. A socket file that was deleted, or replaced by one nobody listens on,
    is re-bound (``remove_stale_socket`` then bind, as at startup); one some live process
    listens on is never unlinked: it is remembered as ``occupied`` until it changes.
    """

    def __init__(self, ctx: LaunchContext, paths: RuntimePaths, lock: LifetimeLock) -> None:
        self.paths = paths
        self.lock = lock
        self.mc_home = ctx.mc_home.resolve()
        self.identity: FileIdentity | None = None
        self._foreign: FileIdentity | None = None
        self._started_at = int(time.time())

    def bind(self) -> socket.socket:
        """Remove a stale socket and bind ours; raises ``OSError`` / ``UnsafeRuntimeDir``."""
        ensure_private_dir(self.paths.socket_dir)
        remove_stale_socket(self.paths.socket, self.lock)
        sock, self.identity = bind_socket(self.paths.socket, self.lock)
        self._foreign = None
        try:
            _write_info(self.paths, self.mc_home, self._started_at)
        except BaseException:
            sock.close()
            self.close()
            raise
        return sock

    def check(self) -> Literal["ok", "lock_lost", "socket_lost", "occupied"]:
        if not self.lock.still_owns_path():
            return "lock_lost"
        current = socket_identity(self.paths.socket)
        if current is not None and current == self.identity:
            return "ok"
        self.identity = None  # our file is gone: never treat a later one as ours
        if current is not None and current == self._foreign:
            return "occupied"
        return "socket_lost"

    def rebind(self) -> socket.socket:
        try:
            return self.bind()
        except (OSError, UnsafeRuntimeDir):
            self._foreign = socket_identity(self.paths.socket)
            raise

    def close(self) -> None:
        """Remove the socket if it is still the one we bound (holder only; idempotent),
        then its directory if that is this home's own and now empty.

        A successor that created the directory before taking the lock creates it again
        when it binds.
        """
        identity, self.identity = self.identity, None
        if identity is None or not self.lock.held:
            return
        if (
            remove_own_socket(self.paths.socket, self.lock, identity)
            and self.paths.socket_dir_is_own
        ):
            with contextlib.suppress(OSError):  # not empty, or already gone
                os.rmdir(self.paths.socket_dir)


def _serve(
    ctx: LaunchContext,
    keeper: SocketKeeper,
    on_demand: bool,
    ready: _ReadyPipe,
    notifier: Notifier,
    journal: bool,
) -> int:
    build = build_id()  # of the files as they are now, before anything else is loaded
    # Start-up allocates much and frees little: collections during the imports would only
    # scan what lives as long as the daemon, so they wait until it is loaded, and what it
    # loaded is frozen out of every later collection.
    gc.disable()
    try:
        import uvloop

        from magi_code.composition import build_coordinator
        from magi_code.providers.http import warm_bundled_roots
        from magi_code.tools.sandbox import bubblewrap
        from magi_code.turns.runtime import warm_turn_modules

        from .allocations import AllocationTracer, trace_frames
        from .heap import HeapTrimmer, share_one_arena
        from .preload import import_product_modules
        from .reaper import OrphanReaper, become_subreaper, stop_descendants
        from .supervised import SupervisedServer

        share_one_arena()  # before any thread starts
        import_product_modules()
    except (ImportError, SyntaxError, OSError, AttributeError, NameError) as exc:
        # A broken or half-replaced install: nothing to serve with.
        log.error("cannot load the installed package (%s)", type(exc).__name__)
        ready.fail(f"cannot load the installed magi-code package ({type(exc).__name__})")
        return EXIT_UNSAFE
    finally:
        gc.freeze()
        gc.enable()

    async def main() -> str | None:
        # Every orphaned descendant (a detached tool process) stays ours: the tool barrier
        # refuses it, and the stop below ends it.
        reaper = OrphanReaper() if become_subreaper() else None
        coordinator = await build_coordinator(ctx, ("unix",))
        sock = keeper.bind()
        server = SupervisedServer(
            coordinator,
            mc_home=ctx.mc_home,
            socket_path=keeper.paths.socket,
            version=package_version(),
            build_id=build,
            idle_seconds=idle_seconds(ctx, on_demand),
            mode="on_demand" if on_demand else "foreground",
            endpoint=keeper,
            outbound_limit=outbound_limit(ctx),
            client_timeout=client_timeout(ctx),
            heap=HeapTrimmer.for_this_process(),
            reaper=reaper,
        )
        server.notifier = notifier
        if server.core.handover is not None:
            server.core.handover.timeout = control_request_timeout(ctx)
        server.log_target = "journal" if journal else None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.request_stop, "signal")
        if frames := trace_frames(ctx.env):
            tracer = AllocationTracer(keeper.paths.state_dir, frames)
            tracer.start()
            loop.add_signal_handler(signal.SIGUSR2, tracer.request)

        def warm() -> None:
            warm_turn_modules()
            loop.run_in_executor(None, _remove_session_leftovers, ctx.sessions_dir)
            # Whether a workspace_write turn can run here (`status` reports it).
            loop.run_in_executor(None, bubblewrap)
            # The CA roots a first provider client needs (~20 ms, mostly outside the GIL).
            loop.run_in_executor(None, warm_bundled_roots)

        def on_ready() -> None:  # the socket answers from here on
            ready.ok()
            notifier.ready(f"serving (version {package_version()})")
            loop.call_later(WARM_AFTER_READY_SECONDS, warm)

        await server.serve(sock, on_ready)
        # Turns are drained; what their commands left running (detached) ends with us.
        left = await asyncio.to_thread(stop_descendants)
        if left:
            log.info("stopped processes left by tools count=%d", left)
        return server.stop_reason

    reason = uvloop.run(main())
    return EXIT_RESTART if reason in RESTART_REASONS else 0


def _remove_session_leftovers(sessions_dir: Path) -> None:
    """What a crash of this daemon (or of any service) left half-created or half-removed
    in the sessions directory, which no session ID reaches."""
    from magi_code.sessions.store import remove_leftovers

    if removed := remove_leftovers(sessions_dir):
        log.info("removed directories crashes left among the sessions count=%d", removed)


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
    # The starter waits for the process it spawned: that one exits here, and the daemon
    # goes on in its child (adopted by init, never a zombie of the starter). Nothing
    # runs a thread yet. /proc/<pid>/environ is still the one exec'd with.
    if os.fork():
        os._exit(0)
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


def _write_info(paths: RuntimePaths, mc_home: Path, started_at: int) -> None:
    info = {
        "pid": os.getpid(),
        "version": package_version(),
        "build_id": build_id(),
        "socket": str(paths.socket),
        "mc_home": str(mc_home),
        "protocol_versions": list(SUPPORTED_VERSIONS),
        "started_at": started_at,
    }
    atomic_write(paths.info, orjson.dumps(info), 0o600)


def _describe(exc: Exception) -> str:
    """One operator line for a startup failure (it may name files, never secrets)."""
    if isinstance(exc, OSError) and not isinstance(exc, UnsafeRuntimeDir):
        where = f" {exc.filename}" if exc.filename else ""
        return f"cannot use{where}: {exc.strerror or type(exc).__name__}"
    return str(exc)


def _setup_logging(path: Path, *, journal: bool, max_bytes: int) -> None:
    # Event names and codes only: never environments, request data or provider text.
    # Under systemd (stderr is the journal stream) the journal alone gets each line, once;
    # otherwise ``daemon.log``, and in the foreground the CLI's stderr handler stays too.
    if journal:
        _log_to_journal()
        return
    handler = _PrivateLog(path, maxBytes=max_bytes, backupCount=LOG_BACKUPS)
    handler.setFormatter(logs.file_formatter(os.environ))
    logging.getLogger().addHandler(handler)
    _daemon_levels()


def log_max_bytes(ctx: LaunchContext) -> int:
    """``MC_DAEMON_LOG_BYTES``: the size at which ``daemon.log`` is rotated."""
    raw = ctx.env.get(LOG_BYTES_ENV, "")
    return max(LOG_MIN_BYTES, int(raw)) if raw.isdigit() else LOG_MAX_BYTES


class _PrivateLog(logging.handlers.RotatingFileHandler):
    """``daemon.log``, rotated by size; each file it opens (at start and after every
    rotation) is created 0600 and opened only as a regular file: a symlink or FIFO
    planted at the path fails the open (``storage.files.open_regular``)."""

    def _open(self) -> io.TextIOWrapper:
        fd = open_regular(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)


def _daemon_levels() -> None:
    # Ours at MC_LOG_LEVEL (default INFO: lifecycle events, one line per turn end);
    # everything else (httpx logs URLs) stays at the root's WARNING.
    logging.getLogger("magi_code").setLevel(logs.level(os.environ, logging.INFO))


class _JournalFormatter(logging.Formatter):
    """``<N>`` syslog priority on every line (journald parses it); no timestamps."""

    PRIORITIES: Final = {"CRITICAL": 2, "ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        priority = self.PRIORITIES.get(record.levelname, 6)
        lines = self._inner.format(record).splitlines()
        return "\n".join(f"<{priority}>{line}" for line in lines)


def _log_to_journal() -> None:
    """The root logger's only stderr handler: the journal's (the CLI's goes)."""
    root = logging.getLogger()
    for existing in list(root.handlers):
        if type(existing) is logging.StreamHandler and existing.stream in (
            sys.stderr,
            sys.__stderr__,
        ):
            root.removeHandler(existing)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JournalFormatter(logs.formatter(os.environ, "%(name)s: %(message)s")))
    root.addHandler(handler)
    _daemon_levels()


class _ReadyPipe:
    """The starter's readiness pipe: ``READY`` or ``ERR <reason>``, then closed.

    Without a pipe (``daemon run`` in the foreground) a failure before readiness is one
    ``magi-code: <reason>`` line on stderr instead.
    """

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        self._answered = False
        # Set while we hold the lifetime lock: an ``ERR`` waits until it is released, so
        # the starter reading it finds the lock free, not still held by this exiting
        # daemon (which it would take for another one, wait for, and start again).
        self.under_lock = False
        self._failure: bytes | None = None

    def ok(self) -> None:
        self._send(b"READY\n")

    def fail(self, reason: str) -> None:
        line = reason.replace("\n", " ")
        if self._fd is None and not self._answered:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"magi-code: {line}\n")
        data = f"ERR {line}".encode()[:1000] + b"\n"
        if self.under_lock:
            self._answered = True
            self._failure = self._failure or data
            return
        self._send(data)

    def lock_released(self) -> None:
        self.under_lock = False
        if self._failure is not None:
            self._send(self._failure)

    def _send(self, data: bytes) -> None:
        self._answered = True
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(fd, data)
        with contextlib.suppress(OSError):
            os.close(fd)
