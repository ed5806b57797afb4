"""The shim's string launch context spells every path as pathlib and ``LaunchContext`` do.

The stdio shim states its launch context without pathlib (``storage.process``,
``client.handshake.process_launch``); the daemon and every other client build a
``LaunchContext``. Both must name the same home and project, byte for byte.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from magi_code.client.handshake import context_of, launch_of, process_launch
from magi_code.storage.launch import LaunchContext
from magi_code.storage.process import absolute, home_of, joined, spelled

# Slashes and dots are all that pathlib treats specially; one letter stands for the rest.
PATHS = st.text(alphabet="/.a", max_size=12)
RELATIVES = st.text(alphabet="/.b", max_size=8).filter(lambda path: not path.startswith("/"))


@given(PATHS, RELATIVES)
@example("", "")
@example("/", ".")
@example("//", "b")
@example("///", "b")
@example("//a", "b//")
@example("..", "b/./c")
@example("./", ".magi-code")
@example("/.", "..")
@example("a//b/", "")
def test_spelled_absolute_and_joined_are_pathlibs(path: str, relative: str) -> None:
    assert spelled(path) == str(PurePosixPath(path))
    assert absolute(path) == str(Path(path).absolute())
    assert joined(path, relative) == str(PurePosixPath(path) / relative)


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
    assert launch.mc_home == home_of(env)
    assert launch == launch_of(LaunchContext.from_process())
    assert context_of(launch) == LaunchContext.from_process()
