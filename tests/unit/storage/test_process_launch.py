"""The shim's string launch context spells every path as pathlib and ``LaunchContext`` do.

The stdio shim states its launch context without pathlib (``storage.process``,
``client.handshake.process_launch``); the daemon and every other client build a
``LaunchContext``. Both must name the same home and project, byte for byte.
"""

from __future__ import annotations

import itertools
from pathlib import Path, PurePosixPath

import pytest

from magi_code.client.handshake import context_of, launch_of, process_launch
from magi_code.storage.launch import LaunchContext
from magi_code.storage.process import absolute, home_of, joined, spelled

PIECES = ("", "/", "//", "///", ".", "..", "a", "./", "a/", "/.", "//a", "a//b", ".a", "a.")
SPELLINGS = sorted(
    {"".join(parts) for n in (1, 2, 3) for parts in itertools.product(PIECES, repeat=n)}
)


@pytest.mark.parametrize("path", SPELLINGS)
def test_spelled_absolute_and_joined_are_pathlibs(path: str) -> None:
    assert spelled(path) == str(PurePosixPath(path))
    assert absolute(path) == str(Path(path).absolute())
    for relative in ("b", ".magi-code", ".", "b/./c", "b//", ""):
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
