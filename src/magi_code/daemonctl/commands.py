"""``magi-code daemon start|stop|restart|status|run|install|uninstall``: operator commands.

Messages here are for the operator's terminal and may name files; they never contain
secrets. Every failure is one ``magi-code: ...`` line on stderr, never a traceback.
Exit codes: 0 success; 1 failure (including a daemon that does not answer, and ``status``
of a socket served by another user); 2 unsafe or unusable runtime directory (a read-only
``MC_HOME``, an installed package that cannot be imported); 3 ``status`` of a daemon that
is not running (and ``run`` when another daemon holds the lock); 4 ``status`` of a daemon
that runs but does not answer; 75 ``run`` that stopped to be replaced (another build's
client, ``restart``): a service manager starts it again. ``install`` refuses to replace
a different unit and ``uninstall`` to remove one it did not write (exit 1, unless
``--force``).

Bounds: connecting, ``hello`` and each control answer get ``handshake.CONNECT_TIMEOUT``
each (``MC_DAEMON_ANSWER_TIMEOUT_SECONDS`` in the command's environment overrides it), so
``stop`` and ``status`` report a daemon that accepts but does not answer (stopped with
SIGSTOP, wedged) within a few seconds; ``stop`` waits up to :data:`STARTING_WAIT_SECONDS`
for a lock holder that has no socket yet (starting), and up to :data:`STOP_TIMEOUT_SECONDS`
for a daemon that accepted ``stop`` to drain. Nothing here ever kills a process; only
``uninstall`` unlinks a file (the unit ``install`` wrote).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Final, TextIO

import orjson

from magi_code.client.errors import (
    DaemonDraining,
    DaemonError,
    DaemonTimeout,
    DaemonUnavailable,
    ForeignDaemon,
)
from magi_code.client.handshake import answer_timeout
from magi_code.daemon.control_role import RESTART_TURN_WAIT_SECONDS
from magi_code.endpoint.lock import StartLockTimeout, is_held
from magi_code.endpoint.paths import RuntimePaths, UnsafeRuntimeDir, read_info, runtime_paths
from magi_code.protocol.v2 import SUPPORTED_VERSIONS
from magi_code.storage.files import atomic_write, read_regular
from magi_code.storage.launch import LaunchContext
from magi_code.version import build_id

from .units import (
    LAUNCHD_LABEL,
    SYSTEMD_UNIT_NAME,
    enable_instructions,
    enablement_links,
    install_target,
    is_our_unit,
    reload_instructions,
    render_unit,
)

STARTING_WAIT_SECONDS: Final = 15.0
STOP_TIMEOUT_SECONDS: Final = 150.0
# The daemon lets its turns run for a while, then drains as on ``stop``.
RESTART_TIMEOUT_SECONDS: Final = RESTART_TURN_WAIT_SECONDS + STOP_TIMEOUT_SECONDS
MANAGER_RESTART_SECONDS: Final = 10.0  # systemd's RestartSec is 2 s
OTHER_BUILD: Final = "it runs another build than this magi-code"
EXIT_FAILURE: Final = 1
EXIT_UNSAFE: Final = 2
EXIT_NOT_RUNNING: Final = 3
EXIT_NOT_RESPONDING: Final = 4  # LSB: status unknown (a live daemon that does not answer)
FOREIGN_SOCKET: Final = "the socket is served by another user"


def main(
    ctx: LaunchContext, action: str, *, json: bool, print_unit: bool, force: bool = False
) -> int:
    try:
        if action == "start":
            return _run(_start(ctx))
        if action == "stop":
            return _run(_stop(ctx))
        if action == "restart":
            return _run(_restart(ctx))
        if action == "status":
            return _run(_status(ctx, json))
        if action == "install":
            return _install(ctx, print_unit, force)
        if action == "uninstall":
            return _uninstall(ctx, force)
    except UnsafeRuntimeDir as exc:
        return _fail(str(exc), EXIT_UNSAFE)
    except (DaemonError, DaemonUnavailable, StartLockTimeout) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(_os_reason(exc))
    return _fail(
        f"unknown daemon command {action!r}; "
        "use start, stop, restart, status, run, install or uninstall"
    )


def run(ctx: LaunchContext, *, on_demand: bool, ready_fd: int | None) -> int:
    """``daemon run``: the daemon itself reports its startup failures (one line)."""
    # Only this command loads the daemon: status, stop and the rest stay quick to start.
    from magi_code.daemon.lifecycle import run_daemon

    try:
        return run_daemon(ctx, on_demand=on_demand, ready_fd=ready_fd)
    except UnsafeRuntimeDir as exc:
        return _fail(str(exc), EXIT_UNSAFE)
    except OSError as exc:
        return _fail(_os_reason(exc))


def _run(coro: Any) -> int:
    result: int = _run_value(coro)
    return result


def _run_value(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


def _fail(message: str, code: int = EXIT_FAILURE, stream: TextIO | None = None) -> int:
    (stream or sys.stderr).write(f"magi-code: {message}\n")
    return code


def _os_reason(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or type(exc).__name__}"


async def _start(ctx: LaunchContext) -> int:
    from magi_code.client.starter import DaemonStartError, ensure_daemon

    try:
        welcome = await ensure_daemon(ctx)
    except DaemonStartError as exc:
        return _fail(f"cannot start the daemon: {exc}")
    sys.stdout.write(f"magi-code daemon running (pid {welcome.get('pid')})\n")
    if welcome.get("build_id") != build_id():
        sys.stdout.write(f"  {OTHER_BUILD}; it is replaced once idle\n")
    return 0


async def _connect(ctx: LaunchContext) -> Any:
    """A control client of this home's daemon (hello names ``MC_HOME``); bounded waits."""
    from magi_code.client import Channel, Client, socket_for

    channel = await Channel.open(
        socket_for(ctx),
        "control",
        ctx,
        client_name="magi-code daemon",
        timeout=answer_timeout(ctx.env),
    )
    return Client(channel)


async def _control(ctx: LaunchContext, client: Any, op: str) -> dict[str, Any]:
    timeout = answer_timeout(ctx.env)
    try:
        result: dict[str, Any] = await asyncio.wait_for(client.control(op), timeout)
    except TimeoutError:
        raise DaemonTimeout(f"the daemon did not answer `{op}` within {timeout:g} s") from None
    return result


async def _query(ctx: LaunchContext) -> dict[str, Any]:
    client = await _connect(ctx)
    try:
        return await _control(ctx, client, "status")
    finally:
        await client.close()


def _recorded(paths: RuntimePaths) -> dict[str, Any]:
    info = read_info(paths) or {}
    return {
        "pid": info.get("pid"),
        "socket": info.get("socket", str(paths.socket)),
        "version": info.get("version"),
        "build_id": info.get("build_id"),
        "protocol_versions": info.get("protocol_versions"),
    }


def query_daemon(ctx: LaunchContext) -> dict[str, Any]:
    """``daemon status --json``'s document (bounded waits, touches nothing)."""
    state: tuple[dict[str, Any], bool] = _run_value(_daemon_state(ctx))
    return state[0]


async def _daemon_state(ctx: LaunchContext) -> tuple[dict[str, Any], bool]:
    """The status document, and whether the socket path is served by something else."""
    paths = runtime_paths(ctx)
    status: dict[str, Any] | None = None
    error = "it does not answer"
    blocked = False  # something else answers on our socket path
    try:
        status = await _query(ctx)
    except DaemonDraining:
        error = "the daemon is stopping"
    except DaemonUnavailable:
        pass
    except ForeignDaemon:
        error, blocked = FOREIGN_SOCKET, True
    except DaemonTimeout as exc:
        error = str(exc)
    except DaemonError as exc:  # a refusal: another home's daemon, an incompatible one
        error, blocked = str(exc), True
    if status is None and is_held(paths.lock):
        # Live but not answering (stopped, wedged, draining, incompatible, or its socket
        # path taken by another user's process): report, never touch it.
        status = {"running": True, "responding": False, **_recorded(paths), "error": error}
    if status is None:
        status = {
            "running": False,
            "pid": None,
            "socket": str(paths.socket),
            "version": None,
            "build_id": None,
            "protocol_versions": list(SUPPORTED_VERSIONS),
        }
        if blocked:
            status["error"] = error
    status.setdefault("log", str(paths.log))
    return status, blocked


async def _status(ctx: LaunchContext, as_json: bool) -> int:
    status, blocked = await _daemon_state(ctx)
    error = status.get("error")
    if as_json:
        sys.stdout.write(orjson.dumps(status).decode() + "\n")
    elif status["running"]:
        sys.stdout.write(
            f"magi-code daemon running: pid {status['pid']}, version {status['version']}\n"
            f"  build:   {status.get('build_id')}\n"
            f"  socket:  {status['socket']}\n"
            f"  log:     {_log_where(status['log'])}\n"
            f"  clients: {status.get('clients', '?')}, "
            f"turns: {status.get('active_turns', '?')} "
            f"({status.get('detached_turns', '?')} detached)\n"
        )
        if "rss_bytes" in status:
            sys.stdout.write(_health_lines(status))
        sandbox = status.get("sandbox") or {}
        if sandbox.get("workspace_write") is not None:
            usable = "can run" if sandbox["workspace_write"] else "cannot run"
            why = f" ({sandbox['problem']})" if sandbox.get("problem") else ""
            sys.stdout.write(f"  sandbox: {usable} workspace_write turns{why}\n")
        if status.get("responding") is False:
            sys.stdout.write(f"  not answering: {status.get('error')}\n")
        if status.get("upgrade_pending"):
            sys.stdout.write(
                "  upgrade pending: a client of another build connected; it stops once idle\n"
            )
        elif status.get("restart_pending"):
            sys.stdout.write("  restart pending: it restarts once its turns end\n")
        elif status.get("build_id") not in (None, build_id()):
            sys.stdout.write(
                f"  {OTHER_BUILD}: the next client replaces it when it is idle "
                "(or run `magi-code daemon restart`)\n"
            )
    elif blocked:
        sys.stdout.write(f"magi-code daemon not running: {error} ({status['socket']})\n")
    else:
        sys.stdout.write("magi-code daemon not running\n")
    # --json answers in the document (scripts read "running" and "error"); text follows
    # LSB status codes: 0 running, 3 not running, 4 running but not answering, 1 not
    # running but the socket path is served by something else (another user's process,
    # another home's daemon).
    if as_json:
        return 0
    if status["running"]:
        return EXIT_NOT_RESPONDING if status.get("responding") is False else 0
    return EXIT_FAILURE if blocked else EXIT_NOT_RUNNING


async def _stop(ctx: LaunchContext) -> int:
    paths = runtime_paths(ctx)
    loop = asyncio.get_running_loop()
    starting_deadline = loop.time() + STARTING_WAIT_SECONDS
    client: Any = None
    while client is None:
        try:
            client = await _connect(ctx)
        except DaemonDraining:
            break  # already stopping (another stop, idle): wait for the lock below
        except DaemonUnavailable:
            if not is_held(paths.lock):
                sys.stdout.write("magi-code daemon not running\n")
                return 0
            if loop.time() >= starting_deadline:
                return _fail(
                    f"a process (pid {_recorded(paths)['pid']}) holds the daemon lock for this "
                    f"MC_HOME but has not opened its socket for {STARTING_WAIT_SECONDS:g} s; "
                    "nothing was stopped"
                )
            await asyncio.sleep(0.1)  # starting: its socket appears once it can answer
        except DaemonTimeout as exc:
            return _not_answering(paths, exc)
        except DaemonError as exc:
            return _fail(f"cannot stop the daemon: {exc}")
    if client is not None:
        try:
            await _control(ctx, client, "stop")
            # The daemon closes this connection once every turn is drained.
            await asyncio.wait_for(_until_closed(client), STOP_TIMEOUT_SECONDS)
        except DaemonTimeout as exc:
            return _not_answering(paths, exc)
        except (DaemonUnavailable, DaemonError, TimeoutError):
            pass  # closed before or while answering: it is stopping
        finally:
            await client.close()
    deadline = loop.time() + STOP_TIMEOUT_SECONDS
    while is_held(paths.lock):
        if loop.time() > deadline:
            return _fail(
                f"the daemon (pid {_recorded(paths)['pid']}) did not stop within "
                f"{STOP_TIMEOUT_SECONDS:g} s"
            )
        await asyncio.sleep(0.05)
    sys.stdout.write("magi-code daemon stopped\n")
    return 0


async def _restart(ctx: LaunchContext) -> int:
    """Stop the daemon once its turns end (at once when idle), then start one again.

    A daemon run by a service manager (``mode`` ``foreground``) is given
    :data:`MANAGER_RESTART_SECONDS` to be started again by it before one is started here.
    """
    from magi_code.client.starter import DaemonStartError, ensure_daemon

    paths = runtime_paths(ctx)
    loop = asyncio.get_running_loop()
    old_pid: object = None
    managed = False
    try:
        client = await _connect(ctx)
    except DaemonUnavailable:
        client = None  # not running, or already stopping: wait for its lock below
    except DaemonTimeout as exc:
        return _not_answering(paths, exc, "restart")
    if client is not None:
        try:
            status = await _control(ctx, client, "status")
            old_pid, managed = status.get("pid"), status.get("mode") == "foreground"
            result = await _control(ctx, client, "restart")
            turns = result.get("waiting_for_turns") or 0
            if turns:
                sys.stdout.write(f"waiting for {turns} running turn(s) to end\n")
                sys.stdout.flush()
            await asyncio.wait_for(_until_closed(client), RESTART_TIMEOUT_SECONDS)
        except DaemonTimeout as exc:
            return _not_answering(paths, exc, "restart")
        except (DaemonUnavailable, DaemonError, TimeoutError):
            pass  # closed before or while answering: it is stopping
        finally:
            await client.close()
    deadline = loop.time() + STOP_TIMEOUT_SECONDS
    while is_held(paths.lock) and _recorded(paths)["pid"] in (old_pid, None):
        if loop.time() > deadline:
            return _fail(f"the daemon (pid {old_pid}) did not stop in time; nothing was started")
        await asyncio.sleep(0.05)
    if managed:
        manager_deadline = loop.time() + MANAGER_RESTART_SECONDS
        while loop.time() < manager_deadline and not is_held(paths.lock):
            await asyncio.sleep(0.1)
    try:
        welcome = await ensure_daemon(ctx)
    except DaemonStartError as exc:
        return _fail(f"the daemon stopped but did not start again: {exc}")
    sys.stdout.write(f"magi-code daemon restarted (pid {welcome.get('pid')})\n")
    return 0


def _not_answering(paths: RuntimePaths, exc: DaemonError, action: str = "stop") -> int:
    return _fail(
        f"cannot {action} the daemon (pid {_recorded(paths)['pid']}): {exc}; it may be "
        "stopped (SIGSTOP) or wedged. Nothing was stopped; resume it (kill -CONT) or end that pid"
    )


async def _until_closed(client: Any) -> None:
    async for _ in client.events():
        pass


def _health_lines(status: dict[str, Any]) -> str:
    children = ", ".join(f"{kind} {n}" for kind, n in status["children"].items())
    connections = ", ".join(f"{role} {n}" for role, n in status["connections"].items())
    return (
        f"  process: up {status['uptime_seconds']} s, {status['rss_bytes'] // 1024} KiB "
        f"resident, {status['open_fds']} fds, {status['threads']} threads\n"
        f"  children: {children}; zombies {status['zombies']}\n"
        f"  connections: {connections}; "
        f"most queued output {status['max_outbound_queued_bytes']} bytes\n"
        f"  held:    {status['sessions_held']} sessions, "
        f"{status['retained_turns']} finished turns retained "
        f"({status['retained_turn_bytes']} bytes)\n"
    )


def _log_where(log: object) -> str:
    if log == "journal":  # a daemon run by systemd logs to the journal, not a file
        return f"journal (journalctl --user -u {SYSTEMD_UNIT_NAME})"
    return str(log)


UNIT_READ_LIMIT: Final = 1 << 20


def _platform() -> str:
    return "darwin" if sys.platform == "darwin" else "linux"


def _no_target(platform: str) -> int:
    names = "HOME is not" if platform == "darwin" else "neither XDG_CONFIG_HOME nor HOME is"
    return _fail(f"{names} an absolute path; use `magi-code daemon install --print` instead")


def _read_unit(path: Path) -> str | None:
    """The text at ``path`` (through a symlink), or None when it cannot be read as one."""
    try:
        return read_regular(path, UNIT_READ_LIMIT, follow_symlinks=True).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _install(ctx: LaunchContext, print_only: bool, force: bool = False) -> int:
    """Write the unit; an existing file is kept unless it is identical or ``force``."""
    platform = _platform()
    executable = shutil.which("magi-code", path=ctx.env.get("PATH")) or _sibling_script()
    if executable is None:
        return _fail("cannot find the magi-code executable on PATH")
    _, content = render_unit(platform, os.path.abspath(executable), ctx.mc_home.resolve())
    if print_only:
        sys.stdout.write(content)
        return 0
    target = install_target(platform, ctx.env)
    if target is None:
        return _no_target(platform)
    replaced = os.path.lexists(target)
    if replaced and _read_unit(target) == content:
        sys.stdout.write(f"{target} is already installed (unchanged).\n")
        sys.stdout.write(enable_instructions(platform, target))
        return 0
    if replaced and not force:
        return _fail(
            f"{target} exists and differs from the unit this would write; nothing was "
            "changed (compare with `magi-code daemon install --print`, or use --force)"
        )
    atomic_write(target, content.encode(), 0o644)
    sys.stdout.write(f"{'Replaced' if replaced else 'Installed'} {target}.\n")
    sys.stdout.write(enable_instructions(platform, target))
    if replaced:
        sys.stdout.write(reload_instructions(platform, target))
    return 0


def _uninstall(ctx: LaunchContext, force: bool) -> int:
    """Remove the unit ``install`` wrote (any file there with ``force``), and what it made.

    systemd: an enabled unit (a ``*.wants`` link to it) is refused unless ``force``,
    which removes those links too; then the ``systemd/user`` and ``systemd`` directories
    under the config home are removed if they are empty (never the config home itself).
    """
    platform = _platform()
    target = install_target(platform, ctx.env)
    if target is None:
        return _no_target(platform)
    if not os.path.lexists(target):
        sys.stdout.write(f"No magi-code unit is installed at {target}; nothing to do.\n")
        return 0
    content = _read_unit(target)
    if not force and (content is None or not is_our_unit(content)):
        what = "cannot be read as a unit" if content is None else "was not written by magi-code"
        return _fail(f"{target} {what}; nothing was removed (use --force to remove it anyway)")
    links = enablement_links(target) if platform == "linux" else []
    if links and not force:
        return _fail(
            f"{SYSTEMD_UNIT_NAME} is enabled ({links[0]}); run `systemctl --user disable "
            f"--now {SYSTEMD_UNIT_NAME}` first (or use --force); nothing was removed"
        )
    for link in links:
        os.unlink(link)
        sys.stdout.write(f"Removed {link}\n")
        _remove_if_empty(link.parent)
    os.unlink(target)
    sys.stdout.write(f"Removed {target}\n")
    if platform == "darwin":
        sys.stdout.write(
            f"If it is loaded, unload it with:\n  launchctl bootout gui/$(id -u)/{LAUNCHD_LABEL}\n"
        )
        return 0
    for directory in (target.parent, target.parent.parent):  # systemd/user, systemd
        _remove_if_empty(directory)
    sys.stdout.write("Then reload systemd's user manager:\n  systemctl --user daemon-reload\n")
    if links:
        sys.stdout.write(
            f"A daemon it started runs until: systemctl --user stop {SYSTEMD_UNIT_NAME}\n"
        )
    return 0


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        return  # not empty (or not ours to remove): kept
    sys.stdout.write(f"Removed empty directory {directory}\n")


def _sibling_script() -> str | None:
    candidate = Path(sys.executable).parent / "magi-code"
    return str(candidate) if candidate.exists() else None
