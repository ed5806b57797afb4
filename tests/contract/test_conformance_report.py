"""``make conformance`` ends with the versions it checked (``tests/contract/conformance.py``).

The gate itself is the contract scenarios and the consumer fixtures, which the suite
runs anyway; here, cheaply, the report: what it reads and prints, and that a run whose
daemons reported no single build fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.conformance import daemon_build, declared_versions, git_revision, report
from tests.contract.fixture_runner import FIXTURES, scenario_files

pytest_plugins = ("pytester",)


@pytest.fixture
def service_mode() -> Iterator[str]:
    """Overrides the mode matrix: no service runs here."""
    yield "none"


def test_the_versions_are_read_from_the_fixture_files(tmp_path: Path) -> None:
    assert declared_versions(scenario_files(), "fixture_schema_version") == (
        [1],
        len(scenario_files()),
    )
    consumer = sorted((FIXTURES / "consumer").glob("*.jsonl"))
    assert declared_versions(consumer, "consumer_fixture_schema_version") == ([2], len(consumer))
    mixed = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"]
    for path, version in zip(mixed, (2, 1, 2), strict=True):
        path.write_text(json.dumps({"fixture_schema_version": version}) + "\n{}\n")
    assert declared_versions(mixed, "fixture_schema_version") == ([1, 2], 3)


def test_the_report_names_one_build_or_fails() -> None:
    lines, identified = report(
        ([1], 84), ([1], 56), {"0.1.0+0123456789abcdef"}, "f00d, with local changes"
    )
    assert identified
    assert lines == [
        "conformance: fixture schema version 1 (84 scenarios), consumer fixture schema "
        "version 1 (56 fixtures)",
        "conformance: backend build 0.1.0+0123456789abcdef (git f00d, with local changes)",
    ]
    assert report(([1], 1), ([1], 1), {"b"}, None)[0][1] == "conformance: backend build b"
    for builds, seen in ((set(), "none (no daemon ran: run both modes)"), ({"b", "a"}, "a, b")):
        lines, identified = report(([1, 2], 3), ([], 0), builds, None)
        assert not identified
        assert lines == [
            "conformance: fixture schema version 1 and 2 (3 scenarios), consumer fixture "
            "schema version none (0 fixtures)",
            f"conformance: FAILED: not one backend build; the daemons reported {seen}",
        ]


def test_the_build_is_the_daemons_and_the_revision_the_checkouts(tmp_path: Path) -> None:
    assert daemon_build(tmp_path) is None
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "daemon.json").write_text(json.dumps({"build_id": "0.1.0+ab", "pid": 1}))
    assert daemon_build(tmp_path) == "0.1.0+ab"
    assert git_revision(tmp_path) is None  # not a checkout


INNER = """
import json
import pytest

@pytest.fixture
def home(tmp_path):
    return tmp_path

@pytest.mark.parametrize("build", [BUILDS])
def test_served(home, build):
    if build:
        (home / "run").mkdir()
        (home / "run" / "daemon.json").write_text(json.dumps({"build_id": build}))
"""


@pytest.mark.parametrize(
    ("builds", "passed"),
    [('"0.1.0+feed", "0.1.0+feed", None', True), ("None", False)],
    ids=["one-build", "no-daemon"],
)
def test_a_run_ends_with_the_report(pytester: pytest.Pytester, builds: str, passed: bool) -> None:
    """(In-process; ``make conformance`` itself runs under xdist, whose workers hand their
    builds to the controller: a lost hand-over fails it as "no daemon ran".)"""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_inner=INNER.replace("BUILDS", builds))
    result = pytester.runpytest("-p", "tests.contract.conformance", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["conformance: fixture schema version 1 (* scenarios), consumer fixture schema *"]
    )
    if passed:
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines(["conformance: backend build 0.1.0+feed*"])
    else:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["conformance: FAILED: not one backend build*"])
