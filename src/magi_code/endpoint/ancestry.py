"""The tool barrier: is a connecting process one of the daemon's own descendants?

Every process the daemon starts (shell tool commands and MCP servers, and whatever they
start; any later hook processes too) is its descendant, and the daemon starts nothing
that should talk to it, so a peer whose ancestors include the daemon is a tool process:
a command the model chose, possibly prompt-injected, that must not ``stop`` the daemon,
take control of detached sessions or snapshot other clients' turns. The daemon refuses
it (``tool_process``) before reading a byte. Peers are looked up by the PID in their
socket credentials (:func:`magi_code.endpoint.peer.peer_pid`).

The rule for what cannot be decided:

- **No PID** (a platform without a PID in the credentials, or a peer outside our PID
  namespace, which the kernel reports as PID 0): admitted. The UID check has passed and
  we cannot tell; refusing would lock out every client there. A tool's process is always
  in the daemon's PID namespace or one nested in it, where it has a PID we can see.
- **The peer exited before the check**: refused. A client that has exited cannot read an
  answer, so refusing it costs an ordinary client nothing, while admitting it would let a
  tool write ``hello`` and ``stop``, exit at once, and win the race against this check
  (a burst of such connections does, every time). Only a client whose connecting process
  exits while another keeps the socket (a fork outliving its parent) would be refused
  wrongly; no ``magi_code`` client does that.
- **An ancestor exited during the walk**: walked again from the peer, whose parent is
  then its new one; if the chain keeps changing, refused like an exited peer.

A PID the kernel reuses between the connect and the check is judged by the new process;
a tool could only steer that with processes outside the daemon's tree, i.e. with the
escapes below.

This is a barrier against a tool driving the daemon directly, not a sandbox. On Linux
the daemon is its descendants' subreaper (``daemon/reaper.py``), so a double fork or
``setsid`` plus the shell exiting re-parents to the daemon and stays refused; on macOS
such a process is re-parented away and admitted. Work handed elsewhere (``systemd-run``,
``at`` or cron, a file the user runs later) is never the daemon's descendant, and
same-user processes can read ``MC_HOME`` or ptrace the daemon anyway (the
``workspace_write`` sandbox, ``tools/sandbox.py``, closes these for shell commands).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import psutil

# Walks of the peer's ancestry before giving up on a chain whose processes keep exiting.
WALK_ATTEMPTS: Final = 3


class Lineage(StrEnum):
    TOOL = "tool"  # a descendant of the daemon: refused
    OTHER = "other"  # not a descendant: admitted
    UNKNOWN = "unknown"  # no PID to look up: admitted (the UID check has passed)
    VANISHED = "vanished"  # exited before we could look: refused


def lineage(peer_pid: int | None, daemon_pid: int) -> Lineage:
    """How the process ``peer_pid`` relates to the daemon process ``daemon_pid``.

    The daemon itself (``peer_pid == daemon_pid``, e.g. probing its own socket) is not its
    own descendant: :attr:`Lineage.OTHER`.
    """
    if peer_pid is None or peer_pid <= 0:
        return Lineage.UNKNOWN
    for _ in range(WALK_ATTEMPTS):
        try:
            ancestors = psutil.Process(peer_pid).parents()
        except psutil.NoSuchProcess:  # the peer, or an ancestor mid-walk, exited
            if not psutil.pid_exists(peer_pid):
                return Lineage.VANISHED
            continue
        except psutil.AccessDenied:
            # Not seen for a process of our own user; the UID check has passed.
            return Lineage.UNKNOWN
        if any(ancestor.pid == daemon_pid for ancestor in ancestors):
            return Lineage.TOOL
        return Lineage.OTHER
    return Lineage.VANISHED


def is_tool_process(peer_pid: int | None, daemon_pid: int) -> bool:
    """True when the daemon must refuse this peer (see :func:`lineage` for the rule)."""
    return lineage(peer_pid, daemon_pid) in (Lineage.TOOL, Lineage.VANISHED)
