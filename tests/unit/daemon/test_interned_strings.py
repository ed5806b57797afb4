"""What a turn does again and again adds nothing to CPython's table of interned strings.

pathlib interns every part of every path it parses. A part made anew for each turn (a
name split or formatted again) is added to the table and freed with its path, and what
that leaves behind makes the table grow for good (~1 MiB) after a few thousand turns; a
grep that built a path for each of a project's files added them all at once. Counted
with a wrapper around ``sys.intern`` that reads each string's interned state before
the call (a 64-bit CPython's own bits: the test is skipped elsewhere).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from magi_code.config.catalog import cache_path
from magi_code.storage.launch import LaunchContext
from magi_code.tools.files import _grep_targets
from magi_code.turns.instructions import system_prompt

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or sys.maxsize < 2**32,
    reason="the layout of a 64-bit CPython's strings",
)


def _interned(text: str) -> bool:
    # A str's state bits follow its refcount, type, length and hash (8 bytes each); the
    # first two say whether, and how, it is interned.
    return bool(ctypes.c_uint32.from_address(id(text) + 32).value & 3)


@pytest.fixture
def added(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The strings ``sys.intern`` adds to the table from now on."""
    strings: list[str] = []
    intern = sys.intern

    def counting(text: str) -> str:
        known = _interned(text)
        result = intern(text)
        if result is text and not known:
            strings.append(text)
        return result

    monkeypatch.setattr(sys, "intern", counting)
    # The check itself: a new name is counted (and pathlib interns through sys.intern).
    Path(f"probe-{id(strings)}")
    if not strings:
        pytest.skip("this pathlib interns nothing")
    strings.clear()
    return strings


def _twice(action: Callable[[], object], added: list[str]) -> list[str]:
    """What the second of two runs of ``action`` adds (the first may add what stays)."""
    action()
    added.clear()
    action()
    return list(added)


def test_a_turns_instructions_and_catalog_paths_add_nothing(
    tmp_path: Path, added: list[str]
) -> None:
    project = tmp_path / "project"
    # Written without pathlib, so that this module's own string is not the one interned.
    os.makedirs(os.path.join(project, ".magi-code"))
    with open(os.path.join(project, ".magi-code", "instructions.md"), "w") as file:
        file.write("Be brief.\n")
    ctx = LaunchContext(mc_home=tmp_path / "home", project_dir=project, env={})

    assert _twice(lambda: system_prompt(project), added) == []
    assert _twice(lambda: cache_path(ctx, "anthropic"), added) == []


def test_a_grep_over_many_files_adds_nothing(tmp_path: Path, added: list[str]) -> None:
    project = tmp_path / "project"
    for directory in range(5):
        (project / f"pkg{directory}").mkdir(parents=True)
        for n in range(100):
            (project / f"pkg{directory}" / f"module_{n}.py").write_text("x = 1\n")
    one = ("pkg3/module_7.py", os.path.join(project, "pkg3", "module_7.py"))
    found: list[tuple[int, bool]] = []

    def grep_targets() -> None:  # (what a run found is let go before the next)
        targets = _grep_targets(project, ".", "*.py")
        found.append((len(targets), one in targets))

    assert _twice(grep_targets, added) == []
    assert found == [(500, True)] * 2
