"""``Sandbox.wrap`` through the shell tool's real runner and a real ``bwrap``: what is
hidden stays hidden however it nests with the project, and detached processes end with
the command (``tools/sandbox.py``)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from tests.support.sandbox_python import PYTHON

from magi_code.tools.sandbox import Sandbox, bubblewrap, service_directories
from magi_code.tools.shell import run_shell

BWRAP = bubblewrap().path
pytestmark = pytest.mark.skipif(BWRAP is None, reason="needs a usable bubblewrap")


@pytest.fixture
def root() -> Iterator[Path]:
    """Outside /tmp: the sandbox's private /tmp would hide it regardless."""
    path = Path(tempfile.mkdtemp(prefix="mc-sbx-", dir="/var/tmp")).resolve()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _run(sandbox: Sandbox, project: Path, command: str) -> str:
    result = await run_shell(
        command, cwd=project, env=dict(os.environ), timeout=60, sandbox=sandbox
    )
    return result.output


async def test_a_project_inside_a_hidden_directory_stays_usable(root: Path) -> None:
    home = root / "home"
    project = home / "work" / "project"
    project.mkdir(parents=True)
    (home / "auth.json").write_text("secret")
    assert BWRAP is not None
    sandbox = Sandbox(BWRAP, network=False, hidden=service_directories(str(home), ()))
    out = await _run(sandbox, project, f"ls -A {home}; echo ok > here.txt; cat here.txt")
    assert "auth.json" not in out and "ok" in out, out
    assert (project / "here.txt").read_text() == "ok\n"


async def test_a_hidden_directory_inside_the_project_stays_hidden(root: Path) -> None:
    project = root / "project"
    home = project / "mc-home"
    home.mkdir(parents=True)
    (home / "auth.json").write_text("secret")
    (project / ".magi-code").mkdir()
    assert BWRAP is not None
    sandbox = Sandbox(BWRAP, network=False, hidden=service_directories(str(home), ()))
    out = await _run(
        sandbox,
        project,
        f"ls -A {home}; echo LISTED; echo x > .magi-code/settings.json || echo REFUSED",
    )
    assert "auth.json" not in out and "LISTED" in out and "REFUSED" in out, out
    assert not (project / ".magi-code" / "settings.json").exists()


async def test_a_detached_process_ends_with_its_command(root: Path) -> None:
    assert BWRAP is not None
    sandbox = Sandbox(BWRAP, network=False, hidden=())
    marker = f"mc-detached-{secrets.token_hex(6)}"
    # The detached sleeper says it runs (a file in the project), then the command ends.
    sleeper = "import pathlib, time; pathlib.Path('started').touch(); time.sleep(600)"
    command = (
        f'setsid -f {PYTHON} -c "{sleeper}" {marker}; '
        "for i in $(seq 600); do test -e started && break; sleep 0.05; done; echo waited"
    )
    out = await _run(sandbox, root, command)
    assert (root / "started").exists(), out
    for _ in range(600):
        left = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
        if not left:
            break
        await asyncio.sleep(0.05)
    assert left == []
