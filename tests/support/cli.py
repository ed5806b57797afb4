"""Run ``magi-code`` commands as a terminal user does: a real process, the test's
``MC_HOME``, stdin given, output captured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.service import service_env


def magi(
    home: Path,
    *args: str,
    stdin: str = "",
    extra: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m magi_code ARGS`` (embedded mode: a command never needs a daemon)."""
    return subprocess.run(
        [sys.executable, "-m", "magi_code", *args],
        input=stdin,
        env=service_env(home, {"MC_SERVICE_MODE": "embedded", **(extra or {})}),
        cwd=cwd or home,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
