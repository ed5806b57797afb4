"""The benchmark scripts keep working (figures are printed, never asserted).

Each script runs once, end to end with its real processes, at its smallest (``--quick``:
every phase once, with the fewest samples and no pauses for the figures' sake). Not marked
``both_modes``: each script starts its own services, in the modes it measures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str) -> str:
    """Run ``benchmarks/<name>`` to its end; its standard output."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


# One test per script, so that the scripts' smoke runs spread over the test workers.
@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py")))
def test_every_benchmark_runs_in_quick_mode(name: str) -> None:
    run_script("run_all.py", "--quick", name)


def test_the_paired_comparison_runs_both_modes_of_this_build() -> None:
    output = run_script(
        "ab_activity.py",
        "--quick",
        f"embedded={sys.executable}:embedded",
        f"daemon={sys.executable}",
    )
    assert "daemon / embedded, events/s: median ratio" in output
    assert "daemon / embedded, loop CPU: " in output


def test_the_window_of_turns_runs() -> None:
    output = run_script("window_activity.py", "--quick")
    assert "turns: 1" in output and "activity events/s, median:" in output


def test_the_soak_runs_briefly_and_leaves_no_child() -> None:
    # Ends at its turn count (the minutes only bound it, loosely: ~12 s on a quiet machine,
    # more on a loaded CI one), with a sample every 2 s, each taken with the daemon idle (the
    # frontends wait, then go on); every turn starts a fresh session.
    output = run_script(
        "soak.py", "--minutes", "2", "--turns", "8", "--interval", "2", "--session-turns", "1",
        "--idle-samples",
    )  # fmt: skip
    assert "slope per 1,000 turns" in output and "p95_ms" in output
    assert "turns 8 on 8 sessions: " in output
    assert "at the end: children {'tool': 0, 'hook': 0, 'mcp_server': 0, 'worker': 0, " in output
    assert "'other': 0}, zombies 0" in output


def test_the_soaks_sessions_compact_at_the_models_window() -> None:
    # A 50-token window: every turn after a session's first compacts it first (the fake
    # provider answers the summary request), as the default 3,000 tokens do in minutes.
    output = run_script(
        "soak.py", "--minutes", "2", "--turns", "16", "--interval", "2", "--session-turns", "8",
        "--idle-samples", "--context-window", "50",
    )  # fmt: skip
    assert "a 50-token context" in output
    (line,) = [x for x in output.splitlines() if x.startswith("   compactions: ")]
    assert int(line.removeprefix("   compactions: ").replace(",", "")) > 0


def test_the_paired_start_up_comparison_runs() -> None:
    # Cold: the mode with the most of the script's own code (the daemon's CPU, waiting for
    # it to go); warm and embedded differ only in what they start.
    output = run_script(
        "ab_startup.py", "--quick", "--mode", "cold", f"a={sys.executable}", f"b={sys.executable}"
    )
    assert "b / a, time: median ratio" in output and "b / a, CPU: median ratio" in output
