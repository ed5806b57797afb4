"""This process's ``MC_HOME`` and file-mode creation mask.

The stdio shim states its launch context from these without building a
:class:`~magi_code.storage.launch.LaunchContext` (no dataclasses), which is built from the
same functions, so both name the same home.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def current_umask() -> int:
    """This process's file-mode creation mask.

    Read from ``/proc/self/status`` where it is there (Linux): the only other way is to
    set a mask and put the old one back, which briefly changes it for every thread, and
    the daemon creates private files from worker threads. Elsewhere the swap is the
    fallback, through 077 so that anything created in that window is private, not open.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def home_of(env: Mapping[str, str]) -> Path:
    """The absolute ``MC_HOME`` of an environment: ``$MC_HOME``, else ``~/.magi-code``
    (relative to the working directory, nothing resolved)."""
    home = env.get("MC_HOME") or Path(env.get("HOME") or os.path.expanduser("~"), ".magi-code")
    return Path(home).absolute()
