"""The v2 handshake without I/O: where the daemon listens, the hello, and what answers mean.

Shared by the asyncio :class:`~magi_code.client.channel.Channel` and the stdio shim's
blocking connect, so both say the same hello and turn the same failures into the same
errors (and messages). Import-light on purpose: no asyncio, no HTTP client, no file locks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from magi_code.durations import seconds_from
from magi_code.endpoint.paths import (
    INFO_NAME,
    read_info_file,
    runtime_dir_of,
    socket_name_of,
    socket_path,
    state_dir_of,
    verify_private_dir,
)
from magi_code.protocol.v2 import Launch, Role, decode_refused, hello, server_frame_type
from magi_code.storage.process import current_umask, home_of
from magi_code.version import package_version

from .errors import DaemonDraining, DaemonError, DaemonTimeout, DaemonUnavailable, ForeignDaemon

if TYPE_CHECKING:
    from magi_code.storage.launch import LaunchContext

# A daemon that accepted the connection answers hello in milliseconds; one that does not
# within this bound is stopped (SIGSTOP) or wedged.
CONNECT_TIMEOUT: Final = 3.0
ANSWER_TIMEOUT_ENV: Final = "MC_DAEMON_ANSWER_TIMEOUT_SECONDS"


def answer_timeout(env: Mapping[str, str], default: float = CONNECT_TIMEOUT) -> float:
    """How long a client waits for the daemon to accept, answer ``hello`` and answer a
    control call: ``MC_DAEMON_ANSWER_TIMEOUT_SECONDS`` in the client's environment (a
    positive number of seconds), else ``default``."""
    return seconds_from(env, ANSWER_TIMEOUT_ENV, default)


def launch_of(ctx: LaunchContext) -> Launch:
    return Launch(str(ctx.mc_home), str(ctx.project_dir), dict(ctx.env), ctx.umask)


def process_launch() -> Launch:
    """This process's launch context, as ``launch_of(LaunchContext.from_process())`` says
    it, without building one (the stdio shim imports no dataclasses)."""
    env = dict(os.environ)
    return Launch(str(home_of(env)), os.getcwd(), env, current_umask())


def context_of(launch: Launch) -> LaunchContext:
    """The :class:`LaunchContext` of a launch (the inverse of :func:`launch_of`)."""
    from magi_code.storage.launch import LaunchContext

    return LaunchContext(Path(launch.mc_home), Path(launch.project_dir), launch.env, launch.umask)


def socket_for(ctx: LaunchContext) -> Path:
    """The socket the daemon of ``ctx.mc_home`` bound (from ``daemon.json``), or the default."""
    return daemon_socket(ctx.mc_home, ctx.env)


def daemon_socket(mc_home: Path | str, env: Mapping[str, str]) -> Path:
    """:func:`socket_for` of an ``MC_HOME`` and environment."""
    default = socket_path(runtime_dir_of(mc_home, env), socket_name_of(mc_home, env))
    info = read_info_file(state_dir_of(mc_home) / INFO_NAME)
    recorded = info.get("socket") if info else None
    return Path(recorded) if isinstance(recorded, str) else default


def check_socket_dir(socket_path: Path | str) -> None:
    """The socket's directory must be private to us before we connect (no daemon: none)."""
    try:
        verify_private_dir(os.path.dirname(os.fspath(socket_path)))
    except FileNotFoundError:
        raise DaemonUnavailable("no daemon is running") from None


def hello_frame(
    role: Role,
    launch: LaunchContext | Launch | None,
    *,
    client_name: str,
    options: Mapping[str, Any] | None = None,
    build: str | None = None,
) -> dict[str, Any]:
    """The ``hello`` this client sends first (RFC-0002 §3)."""
    launch_frame = launch if launch is None or isinstance(launch, Launch) else launch_of(launch)
    return hello(role, launch_frame, client_name, package_version(), options, build)


def seconds(value: float) -> str:
    return f"{value:g} s"


def connect_failure(exc: OSError, socket_path: Path | str, timeout: float) -> Exception:
    """What a failed ``connect`` to the daemon's socket means for the client."""
    # TimeoutError and BlockingIOError are OSErrors: they must come first.
    if isinstance(exc, TimeoutError):
        return DaemonTimeout(f"the daemon did not accept the connection within {seconds(timeout)}")
    if isinstance(exc, BlockingIOError):  # a full backlog: a listener that does not accept
        return DaemonTimeout("the daemon is not accepting connections")
    if isinstance(exc, (FileNotFoundError, ConnectionRefusedError, ConnectionResetError)):
        return DaemonUnavailable("no daemon is running")
    if isinstance(exc, PermissionError):
        if _owner(socket_path) not in (None, os.geteuid()):
            return ForeignDaemon("the socket is served by another user")
        return DaemonUnavailable("the daemon socket cannot be opened")
    return DaemonUnavailable(f"cannot connect to the daemon ({exc.strerror})")


def foreign_peer() -> ForeignDaemon:
    """The daemon end of the socket runs as another user: nothing may be sent to it."""
    return ForeignDaemon("the socket is served by another user; refusing to use it")


def no_answer(timeout: float) -> DaemonTimeout:
    return DaemonTimeout(f"the daemon did not answer the handshake within {seconds(timeout)}")


def closed_early() -> DaemonUnavailable:
    return DaemonUnavailable("the daemon closed the connection")


def invalid_frames() -> DaemonError:
    return DaemonError("the daemon sent an invalid frame", "framing_error")


def welcome_of(first: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``welcome`` in the daemon's first frame, or the error its refusal means.

    ``None`` is a connection that ended before any frame.
    """
    if first is None:
        raise closed_early()
    refusal = decode_refused(first)
    if refusal is not None:
        code = refusal.code
        if code == "draining":
            raise DaemonDraining("the daemon is stopping")
        if code == "tool_process":
            raise DaemonError(
                "the daemon refused the connection (tool_process): commands run by the "
                "agent's tools cannot use the daemon",
                code,
            )
        raise DaemonError(f"the daemon refused the connection ({code})", code)
    if server_frame_type(first) != "welcome":
        raise DaemonError("the daemon answered with an unexpected frame", "protocol_error")
    return dict(first)


def _owner(path: Path | str) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None
