"""The daemon's own process figures for ``status``: memory, descriptors, threads, children.

Computed only when ``status`` is asked (a few ``/proc`` reads), never on a hot path. Live
children are counted by the kind their spawner recorded (``tools/processes.py``); a child
nobody recorded is ``other``, and a child that exited but is not reaped yet is a zombie,
whatever its kind.
"""

from __future__ import annotations

from typing import Any

import psutil

from magi_code.tools.processes import CHILD_KINDS, child_kind


def process_figures() -> dict[str, Any]:
    """``rss_bytes``, ``open_fds``, ``threads``, ``children`` by kind and ``zombies``."""
    me = psutil.Process()
    children = dict.fromkeys((*CHILD_KINDS, "other"), 0)
    zombies = 0
    for child in me.children(recursive=False):
        try:
            zombie = child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # reaped meanwhile
            continue
        if zombie:
            zombies += 1
        else:
            children[child_kind(child.pid) or "other"] += 1
    return {
        "rss_bytes": me.memory_info().rss,
        "open_fds": me.num_fds(),
        "threads": me.num_threads(),
        "children": children,
        "zombies": zombies,
    }
