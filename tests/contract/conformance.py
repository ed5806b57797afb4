"""``make conformance``'s report: what the run checked, printed at its end.

Loaded with ``-p tests.contract.conformance``. A frontend's integration records the
fixture schema versions its consumer was held to and the backend that passed them, so
the last lines of the run say both: the versions the fixture files declare (with how
many files), and the build the daemons that served the scenarios reported in
``daemon.json`` (one build, or the run fails), with the checkout's git revision when
there is one. Under xdist each worker hands its builds to the controller.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.endpoint.paths import INFO_NAME, read_info_file

from .fixture_runner import FIXTURES, scenario_files

ROOT = Path(__file__).resolve().parents[2]
BUILDS = pytest.StashKey[set[str]]()
LINES = pytest.StashKey[list[str]]()
_WORKER_KEY = "conformance_builds"


def declared_versions(files: Iterable[Path], key: str) -> tuple[list[int], int]:
    """The distinct ``key`` values in the files' first lines, and how many files."""
    versions: set[int] = set()
    count = 0
    for path in files:
        with path.open("rb") as file:
            versions.add(orjson.loads(file.readline())[key])
        count += 1
    return sorted(versions), count


def daemon_build(home: Path) -> str | None:
    """The ``build_id`` the daemon of ``home`` recorded, if one ran."""
    info = read_info_file(str(home / "run" / INFO_NAME))
    build = info.get("build_id") if info else None
    return build if isinstance(build, str) else None


def git_revision(root: Path = ROOT) -> str | None:
    """``<commit>`` of the checkout, ``, with local changes`` when it has any; None outside one."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}, with local changes" if changes else head


def _versions(versions: list[int]) -> str:
    return " and ".join(map(str, versions)) or "none"


def report(
    scenarios: tuple[list[int], int],
    consumer: tuple[list[int], int],
    builds: set[str],
    git: str | None,
) -> tuple[list[str], bool]:
    """The report's lines, and whether the backend was identified."""
    lines = [
        f"conformance: fixture schema version {_versions(scenarios[0])} "
        f"({scenarios[1]} scenarios), consumer fixture schema version "
        f"{_versions(consumer[0])} ({consumer[1]} fixtures)"
    ]
    if len(builds) != 1:
        seen = ", ".join(sorted(builds)) or "none (no daemon ran: run both modes)"
        lines.append(f"conformance: FAILED: not one backend build; the daemons reported {seen}")
        return lines, False
    [build] = builds
    lines.append(f"conformance: backend build {build}" + (f" (git {git})" if git else ""))
    return lines, True


def pytest_configure(config: pytest.Config) -> None:
    config.stash[BUILDS] = set()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The gate holds every scenario to the contract in both modes (`make test` runs the
    # transport's in both, the rest in the default mode); before the mode filter runs.
    for item in items:
        item.add_marker(pytest.mark.both_modes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        home = getattr(item, "funcargs", {}).get("home")
        build = daemon_build(home) if isinstance(home, Path) else None
        if build is not None:
            item.config.stash[BUILDS].add(build)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    builds = getattr(node, "workeroutput", {}).get(_WORKER_KEY, [])
    node.config.stash[BUILDS].update(builds)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        builds: set[str] = config.stash[BUILDS]
        workeroutput[_WORKER_KEY] = sorted(builds)
        return
    lines, identified = report(
        declared_versions(scenario_files(), "fixture_schema_version"),
        declared_versions(
            sorted((FIXTURES / "consumer").glob("*.jsonl")), "consumer_fixture_schema_version"
        ),
        config.stash[BUILDS],
        git_revision(),
    )
    config.stash[LINES] = lines
    if not identified and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """After the outcome: the last lines of the run (the controller's, under xdist)."""
    lines = config.stash.get(LINES, [])
    if lines:
        terminalreporter.write_line("")
    for line in lines:
        terminalreporter.write_line(line)
