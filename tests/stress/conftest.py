"""The reliability suite: daemon mode unless a test says otherwise; no daemon outlives it.

Every daemon of a home ``tmp_path/"mc-home*"`` is stopped (and killed if it does not
stop) when its test ends. The figures each test reported are printed at the end of the
run (``make stress``; under xdist they are in each test's captured output instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stress.support import FIGURES, SCALE, SEED
from tests.support import service


@pytest.fixture(autouse=True)
def service_mode(tmp_path: Path) -> Iterator[str]:
    service.set_mode("daemon")
    try:
        yield "daemon"
    finally:
        service.set_mode(service.DEFAULT_MODE)
        service.stop_daemons(tmp_path)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section(f"stress figures (MC_STRESS={SCALE}, MC_STRESS_SEED={SEED})")
        for line in FIGURES:
            terminalreporter.write_line(line)
