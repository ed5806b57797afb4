"""The default mode's fallback: when no daemon can serve, the service runs in-process.

A frontend that cannot run a daemon (a sandboxed or signed helper that may not start a
detached process or use a runtime directory outside its container) must still get its
answers. So in the default mode, when :func:`~magi_code.shim.connect.reach` fails in a
way that means no daemon can be started or reached within the liveness bound, the stdio
service runs the same core in this process instead (``MC_SERVICE_MODE=daemon`` keeps the
daemon-only behaviour). A daemon that answered and refused us (the tool barrier, another
home, too many connections, no common protocol version) is not bypassed: its answer
stands.

The fallback is announced once on stderr and once in this home's ``daemon.log``, both by
a reason code and fixed words: no paths (the detailed reason, which names directories,
is what ``magi-code daemon start`` or ``MC_SERVICE_MODE=daemon`` prints).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Final

from magi_code.client.errors import DaemonTimeout, ForeignDaemon
from magi_code.endpoint.paths import UnsafeRuntimeDir

from .connect import StartFailed

if TYPE_CHECKING:
    from magi_code.protocol.v2 import Launch

# Reason code (the daemon log's) -> what the stderr line says.
REASONS: Final = {
    "runtime_dir": "its runtime directory is unusable",
    "start_failed": "it could not be started",
    "no_answer": "it does not answer",
    "foreign_socket": "its socket is served by another user",
}


def unusable(exc: Exception) -> str | None:
    """The reason code when ``exc`` (raised by ``reach``) means no daemon can serve this
    process; None when a daemon answered and refused us."""
    if isinstance(exc, UnsafeRuntimeDir):
        return "runtime_dir"
    if isinstance(exc, StartFailed):
        return "start_failed"
    if isinstance(exc, DaemonTimeout):
        return "no_answer"
    if isinstance(exc, ForeignDaemon):
        return "foreign_socket"
    return None


def announcement(reason: str) -> str:
    """The stderr line (without the ``magi-code: `` prefix)."""
    return (
        f"cannot use the daemon ({REASONS[reason]}); serving in this process instead "
        "(`magi-code daemon start` says why)"
    )


def log_fallback(launch: Launch, reason: str) -> None:
    """One line in ``daemon.log`` of ``launch.mc_home``, in the daemon's format, when its
    state directory is usable; else nothing (the stderr line is all there is)."""
    import logging

    from magi_code import logs
    from magi_code.endpoint.paths import LOG_NAME, ensure_private_dir, state_dir_of
    from magi_code.storage.files import open_regular

    if logs.level(launch.env, logging.INFO) > logging.WARNING:
        return
    try:
        state = state_dir_of(launch.mc_home)
        ensure_private_dir(state)
        # A FIFO or symlink planted as the log is refused, never waited on.
        fd = open_regular(state / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except (UnsafeRuntimeDir, OSError):
        return
    record = logging.LogRecord(
        "magi_code.shim",
        logging.WARNING,
        __file__,
        0,
        "serving in-process reason=%s",
        (reason,),
        None,
    )
    try:
        with contextlib.suppress(OSError):
            os.write(fd, (logs.file_formatter(launch.env).format(record) + "\n").encode())
    finally:
        os.close(fd)
