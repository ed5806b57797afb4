"""Launch context: where a client's requests resolve home, project and environment.

The core never reads ``os.environ`` or the process cwd for request handling; every
connection carries its own context (v1 stdio: the service process's own; v2: the one the
client sent at hello), so a daemon serves each frontend with that frontend's settings.
That includes the frontend's file-mode creation mask (``umask``): the daemon runs under
077, and the user's own mask applies to what the agent's tools create in the project.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
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


def default_home(env: Mapping[str, str]) -> Path:
    home = env.get("MC_HOME")
    if home:
        return Path(home)
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".magi-code"


@dataclass(frozen=True, slots=True)
class LaunchContext:
    mc_home: Path
    project_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    # The frontend's file-mode creation mask; None when unknown (a client that predates
    # the hello field): ``tool_umask`` then falls back to this process's own.
    umask: int | None = None

    @classmethod
    def from_process(cls) -> LaunchContext:
        env = dict(os.environ)
        return cls(
            mc_home=default_home(env).absolute(),
            project_dir=Path.cwd(),
            env=env,
            umask=current_umask(),
        )

    @property
    def tool_umask(self) -> int:
        """The mask for tool children and files the agent creates in the project.

        The frontend's, else this process's (in the daemon 077: a client that did not say
        gets private modes, never wider than its user may have wanted).
        """
        return self.umask if self.umask is not None else current_umask()

    @property
    def global_settings_path(self) -> Path:
        return self.mc_home / "settings.json"

    @property
    def project_settings_path(self) -> Path:
        return self.project_dir / ".magi-code" / "settings.json"

    @property
    def sessions_dir(self) -> Path:
        return self.mc_home / "sessions"

    @property
    def auth_path(self) -> Path:
        return self.mc_home / "auth.json"

    @property
    def catalog_dir(self) -> Path:
        return self.mc_home / "catalog"
