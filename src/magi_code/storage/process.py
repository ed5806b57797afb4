"""This process's launch context as plain strings: ``MC_HOME``, the mask, path spelling.

Import-light on purpose (no pathlib, no dataclasses): the stdio shim states its launch
context in every start, and :class:`~magi_code.storage.launch.LaunchContext` is built
from the same functions, so both spell every path the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


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


def spelled(path: str) -> str:
    """``str(pathlib.PurePosixPath(path))``: empty and ``.`` parts dropped, ``..`` kept,
    and a leading ``//`` (exactly two slashes) preserved, as POSIX allows."""
    if path.startswith("//") and not path.startswith("///"):
        root = "//"
    else:
        root = "/" if path.startswith("/") else ""
    return root + "/".join(part for part in path.split("/") if part and part != ".") or "."


def joined(base: str, relative: str) -> str:
    """``str(pathlib.PurePosixPath(base) / relative)`` for a ``relative`` that is not
    absolute."""
    base, rest = spelled(base), spelled(relative)
    if rest == ".":
        return base
    if base == ".":
        return rest
    return base + rest if base.endswith("/") else f"{base}/{rest}"


def absolute(path: str) -> str:
    """``str(pathlib.Path(path).absolute())``: relative to the working directory, with
    nothing resolved."""
    return spelled(path) if path.startswith("/") else joined(os.getcwd(), path)


def home_of(env: Mapping[str, str]) -> str:
    """The absolute ``MC_HOME`` of an environment: ``$MC_HOME``, else ``~/.magi-code``."""
    home = env.get("MC_HOME") or joined(env.get("HOME") or os.path.expanduser("~"), ".magi-code")
    return absolute(home)
