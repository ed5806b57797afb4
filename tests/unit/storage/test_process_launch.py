"""The shim's launch context names the home and project as ``LaunchContext`` does.

The stdio shim states its launch context without building a ``LaunchContext``
(``client.handshake.process_launch``); the daemon and every other client build one. Both
must name the same home and project, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from magi_code.client.handshake import context_of, launch_of, process_launch
from magi_code.storage.launch import LaunchContext
from magi_code.storage.process import home_of


@pytest.mark.parametrize(
    "env",
    [
        {"MC_HOME": "/srv/mc//home/"},
        {"MC_HOME": "relative/./home"},
        {"MC_HOME": "", "HOME": "/home/u/"},
        {"HOME": "/"},
        {"HOME": "//"},
        {"HOME": "rel"},
        {},
    ],
)
def test_home_of_is_the_launch_contexts(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("MC_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    launch = process_launch()
    assert launch.mc_home == str(home_of(env))
    assert launch == launch_of(LaunchContext.from_process())
    assert context_of(launch) == LaunchContext.from_process()
