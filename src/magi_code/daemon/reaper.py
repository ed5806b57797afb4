"""The daemon as the subreaper of everything it starts (Linux), so the tool barrier holds.

The tool barrier (``endpoint/ancestry.py``) refuses a peer that descends from the daemon.
A tool command that detaches (``setsid -f``, a double fork) would be re-parented to PID 1
and pass it. As a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) the daemon adopts
every orphaned descendant instead: it stays a descendant, and is refused.

Adopted orphans are the daemon's children, so their exit statuses are the daemon's to
collect, and nothing else waits for them. Everything the daemon starts itself goes
through the event loop (uvloop: libuv waits for each child it spawned by its pid, on
SIGCHLD); reaping one of those first would hide its exit from libuv. So
:class:`OrphanReaper` reaps only a child that has been a zombie since a sweep at least
:data:`REAP_AFTER_SECONDS` ago: the loop has handled SIGCHLD many times since, so libuv
would have collected it if it were its own. Finding no zombie child costs one
``waitid(WNOHANG | WNOWAIT)``; only then is ``/proc`` read, in a worker thread.

When the daemon stops, :func:`stop_descendants` ends what is left (a detached tool
process, anything an MCP server left behind): SIGTERM, a grace period, SIGKILL, reaped.
A daemon killed by SIGKILL cannot do that; sandboxed commands die with it regardless
(``tools.sandbox``: ``--die-with-parent``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from typing import Final

import psutil

from .health import own_children

log = logging.getLogger("magi_code.daemon")

PR_SET_CHILD_SUBREAPER: Final = 36
REAP_AFTER_SECONDS: Final = 1.0
STOP_GRACE_SECONDS: Final = 2.0


def become_subreaper() -> bool:
    """Make this process its descendants' subreaper; False where it cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class OrphanReaper:
    """Collects adopted orphans once they have been zombies for a while (module docstring)."""

    def __init__(self) -> None:
        # (pid, start time) of each zombie child -> when a sweep first saw it.
        self._zombies: dict[tuple[int, float], float] = {}

    @staticmethod
    def due() -> bool:
        """Whether any child is a zombie (one ``waitid``: cheap enough for the event loop)."""
        try:
            return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return False

    def sweep(self) -> int:
        """Reap the children that have been zombies long enough; how many were reaped.
        Blocking (reads ``/proc``); call it when :meth:`due`."""
        now = time.monotonic()
        seen: dict[tuple[int, float], float] = {}
        reaped = 0
        for key in _zombie_children():
            first = self._zombies.get(key, now)
            if now - first < REAP_AFTER_SECONDS:
                seen[key] = first
            elif _reap(key[0]):
                reaped += 1
        self._zombies = seen
        return reaped


def _zombie_children() -> list[tuple[int, float]]:
    found = []
    for child in own_children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append((child.pid, child.create_time()))
        except psutil.Error:
            continue
    return found


def _reap(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def stop_descendants() -> int:
    """SIGTERM every descendant, then SIGKILL every one still there after a grace period
    (found again: one started meanwhile, or a sandbox's init, which ignores SIGTERM from
    outside its namespace, counts too), and reap the children; the number of processes
    signalled. Blocking; for the daemon's last moments (it takes exit statuses the event
    loop may still wait for)."""
    signalled: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL):
        try:
            descendants = psutil.Process().children(recursive=True)
        except psutil.Error:
            break
        if not descendants:
            break
        for proc in descendants:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                signalled.add(proc.pid)
        psutil.wait_procs(descendants, timeout=STOP_GRACE_SECONDS)
        _reap_children()
    return len(signalled)


def _reap_children() -> None:
    """Collect every exited child (a descendant re-parented to us included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
