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
from pathlib import Path
from typing import Final

from magi_code.dataclass import dataclass, field

# Re-exported: where the tools have always imported it from.
from magi_code.storage.process import current_umask as current_umask
from magi_code.storage.process import home_of

# The project's own directory of magi-code files: settings, instructions, skills.
PROJECT_CONFIG_DIR: Final = Path(".magi-code")


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
            mc_home=home_of(env),
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
        """Where the project's settings file is named; read and written only through
        :func:`inside_project` (``config.settings.project_settings_path``)."""
        return self.project_dir / PROJECT_CONFIG_DIR / "settings.json"

    @property
    def sessions_dir(self) -> Path:
        return self.mc_home / "sessions"

    @property
    def auth_path(self) -> Path:
        return self.mc_home / "auth.json"

    @property
    def catalog_dir(self) -> Path:
        return self.mc_home / "catalog"


def inside_project(project_dir: Path, relative: Path) -> Path | None:
    """``project_dir / relative`` with every symlink resolved, or None when that leads out
    of the (resolved) project directory or cannot be resolved. Blocking.

    What is read or locked under the project's ``.magi-code`` goes through this: a
    ``.magi-code`` (or a directory in it) that is a symlink to a directory outside the
    project, ``$MC_HOME`` or another project, is not followed; one that stays inside is.
    """
    try:
        project = Path(os.path.realpath(project_dir))
        resolved = Path(os.path.realpath(project / relative))
    except (OSError, ValueError):
        return None
    return resolved if resolved.is_relative_to(project) else None
