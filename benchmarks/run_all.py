"""Run every benchmark script (``benchmarks/bench_*.py``) in turn, each in its own process.

    .venv/bin/python benchmarks/run_all.py [--quick] [NAME ...]

``--quick`` is passed on to each script (a smoke run of a few seconds each). ``NAME``
selects scripts by name (``protocol`` or ``bench_protocol``); by default every
``bench_*.py`` found here runs, so a new script such as ``bench_daemon.py`` is picked up
without changes. Figures are printed, never asserted; the exit status is non-zero only
when a script fails or exceeds its time budget.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Generous per-script budgets: a full run of all scripts is meant to take ~1-3 minutes.
TIMEOUT_QUICK = 60.0
TIMEOUT_FULL = 300.0
STOP_GRACE = 20.0


def scripts(names: list[str]) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if not names:
        return found
    wanted = {n if n.startswith("bench_") else f"bench_{n}" for n in names}
    wanted = {n.removesuffix(".py") for n in wanted}
    unknown = wanted - {p.stem for p in found}
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    return [p for p in found if p.stem in wanted]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM first, so the script can stop its own processes and remove its temporary
    directories; SIGKILL only if it does not finish."""
    proc.terminate()
    try:
        proc.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the magi-code benchmarks")
    parser.add_argument("--quick", action="store_true", help="smoke run of every script")
    parser.add_argument("names", nargs="*", help="only these scripts (e.g. protocol turns)")
    args = parser.parse_args()
    timeout = TIMEOUT_QUICK if args.quick else TIMEOUT_FULL
    # Stopping the runner stops the running script too (see ``stop``).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    results: list[tuple[str, str, float]] = []
    for script in scripts(args.names):
        command = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
        start = time.perf_counter()
        # The script's output goes straight to ours; it cleans up after itself.
        with subprocess.Popen(command, cwd=HERE.parent) as proc:
            try:
                returncode = proc.wait(timeout)
                outcome = "ok" if returncode == 0 else f"FAILED (exit {returncode})"
            except subprocess.TimeoutExpired:
                outcome = f"FAILED (over {timeout:.0f} s)"
                stop(proc)
            except KeyboardInterrupt:
                stop(proc)
                print(f"interrupted during {script.stem}", file=sys.stderr)
                return 130
        results.append((script.stem, outcome, time.perf_counter() - start))
        print(flush=True)
    print("== summary")
    for name, outcome, elapsed in results:
        print(f"   {name:<24} {outcome:<24} {elapsed:6.1f} s")
    return 0 if all(outcome == "ok" for _, outcome, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
