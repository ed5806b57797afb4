"""Launch context: where a client's requests resolve home, project and environment.

The core never reads ``os.environ`` or the process cwd for request handling; every
connection carries its own context (v1 stdio: the service process's own; v2: the one the
client sent at hello), so a daemon serves each frontend with that frontend's settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


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

    @classmethod
    def from_process(cls) -> LaunchContext:
        env = dict(os.environ)
        return cls(mc_home=default_home(env).absolute(), project_dir=Path.cwd(), env=env)

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
