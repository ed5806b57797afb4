"""Process-group termination shared by the shell tool and MCP server cleanup, the
file-mode creation mask tool children start under, and what kind each live child is.

Children are started in their own session, so a process group holds everything they
start (short of a grandchild calling ``setsid`` itself). Terminating is SIGTERM to the
group, a grace period, then SIGKILL, every wait bounded.

Each spawner records its child's pid and kind (:func:`record_child`) once started and
forgets it once reaped, so the record holds live children only; ``daemon status`` reads
it (:func:`child_kind`) for the children the operating system lists.

Before spawning, each spawner takes a slot (:func:`child_slot`) and holds it until its
child is reaped: at most ``MAX_CHILDREN_PER_TURN`` per turn and ``max_children()`` in
this process, so a runaway turn gets a tool error instead of a fork storm.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Final, Literal

from magi_code.durations import seconds_from
from magi_code.storage.launch import current_umask

TERM_GRACE_SECONDS: Final = 2.0
TERM_GRACE_ENV: Final = "MC_DAEMON_TERM_GRACE_SECONDS"
KILL_GRACE_SECONDS: Final = 2.0
_POLL_SECONDS: Final = 0.05
ChildKind = Literal["tool", "hook", "mcp_server", "worker"]
CHILD_KINDS: Final[tuple[ChildKind, ...]] = ("tool", "hook", "mcp_server", "worker")
_children: dict[int, ChildKind] = {}
# A turn's tools run a few processes at a time (a batch of read-only calls, a hook); the
# process total leaves room for 64 turns' worth beside warm MCP servers.
MAX_CHILDREN_PER_TURN: Final = 16
MAX_CHILDREN_DEFAULT: Final = 128
MAX_CHILDREN_ENV: Final = "MC_DAEMON_MAX_CHILDREN"
_slots_total = 0
_slots_by_owner: dict[int, int] = {}  # id(owner) -> slots held; no entry once none
# Sets the mask given as $1, then becomes the real command (same pid, group, environment).
_UMASK_SCRIPT: Final = 'umask "$1" && shift && exec "$@"'


def under_umask(argv: Sequence[str], umask: int | None) -> list[str]:
    """``argv`` made to start with file-mode creation mask ``umask``.

    ``None``, or the mask this process already has, leaves ``argv`` as it is. Otherwise
    ``/bin/sh`` sets the mask and ``exec``s the command. ``Popen``'s own ``umask=`` is not
    usable: uvloop's ``subprocess_exec``, which the service and the daemon run on, refuses
    it ("unexpected kwargs"), and so does the MCP SDK's spawn on top of it; ``preexec_fn``
    runs Python in the forked child of a threaded process; and changing this process's
    mask around the spawn would change it for the daemon's other threads too.
    """
    if umask is None or umask == current_umask():
        return list(argv)
    return ["/bin/sh", "-c", _UMASK_SCRIPT, "sh", f"{umask:04o}", *argv]


def record_child(pid: int, kind: ChildKind) -> None:
    """Note that child ``pid`` (started by this process, not yet reaped) is a ``kind``."""
    _children[pid] = kind


def forget_child(pid: int) -> None:
    """Child ``pid`` was reaped (or never started): its pid may now be reused."""
    _children.pop(pid, None)


def child_kind(pid: int) -> ChildKind | None:
    return _children.get(pid)


class ChildLimitReached(Exception):
    """No slot for another child process; ``str(exc)`` is the fixed tool error."""

    def __init__(self) -> None:
        super().__init__(
            "Not started: too many processes are running (at most "
            f"{MAX_CHILDREN_PER_TURN} for one turn and {max_children()} in all); wait for "
            "some to finish, then try again."
        )


def max_children() -> int:
    """``MC_DAEMON_MAX_CHILDREN`` (a positive integer), else ``MAX_CHILDREN_DEFAULT``."""
    raw = os.environ.get(MAX_CHILDREN_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else MAX_CHILDREN_DEFAULT


@contextlib.contextmanager
def child_slot(owner: object | None) -> Iterator[None]:
    """Hold one child slot of ``owner`` (a turn's ``ToolContext``; ``None``: counted only
    in the total) for the ``with`` block: spawn, wait, terminate and reap inside it.

    Raises:
        ChildLimitReached: the turn or the process already holds all its slots.
    """
    global _slots_total
    key = id(owner)
    held = _slots_by_owner.get(key, 0) if owner is not None else 0
    if _slots_total >= max_children() or held >= MAX_CHILDREN_PER_TURN:
        raise ChildLimitReached
    _slots_total += 1
    if owner is not None:
        _slots_by_owner[key] = held + 1
    try:
        yield
    finally:
        _slots_total -= 1
        if owner is not None:
            left = _slots_by_owner.pop(key) - 1
            if left:
                _slots_by_owner[key] = left


def term_grace() -> float:
    """``MC_DAEMON_TERM_GRACE_SECONDS`` (a positive number), else ``TERM_GRACE_SECONDS``."""
    return seconds_from(os.environ, TERM_GRACE_ENV, TERM_GRACE_SECONDS)


async def terminate_process_group(pgid: int) -> None:
    """SIGTERM the group, SIGKILL what is left after a grace period; bounded in time."""
    for sig, grace in ((signal.SIGTERM, term_grace()), (signal.SIGKILL, KILL_GRACE_SECONDS)):
        if not await asyncio.to_thread(group_has_live_members, pgid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = asyncio.get_running_loop().time() + grace
        while asyncio.get_running_loop().time() < deadline:
            if not await asyncio.to_thread(group_has_live_members, pgid):
                return
            await asyncio.sleep(_POLL_SECONDS)


def group_has_live_members(pgid: int) -> bool:
    """Whether any non-zombie process is in group ``pgid``.

    ``killpg(pgid, 0)`` also succeeds for zombies, which linger where PID 1 does not
    reap orphans (some containers); a zombie is already dead, so it does not count.
    """
    import psutil  # here, not at the top: a turn that runs no command never loads it

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def group_carries_env(pgid: int, name: str, value: str) -> bool:
    """Whether a live member of group ``pgid`` has ``name=value`` in its environment.

    Checked before killing a group found long ago: its leader may be gone and the id
    reused by an unrelated group, whose members would not carry our token.
    """
    import psutil

    for proc in psutil.process_iter(["status"]):
        try:
            if (
                os.getpgid(proc.pid) == pgid
                and proc.info["status"] != psutil.STATUS_ZOMBIE
                and proc.environ().get(name) == value
            ):
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def find_child_with_env(name: str, value: str) -> int | None:
    """The pid of our direct child whose initial environment has ``name=value``.

    The MCP SDK does not expose the server process it spawns; a per-server token in its
    environment identifies it without guessing from command lines (shebang scripts run
    under their interpreter's name).
    """
    import psutil

    for child in psutil.Process().children(recursive=False):
        try:
            if child.environ().get(name) == value:
                return int(child.pid)
        except psutil.Error:
            continue
    return None
