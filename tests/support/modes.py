"""The service-mode matrix: every contract and process test runs embedded and via the daemon.

``MC_TEST_SERVICE_MODE=embedded`` (or ``daemon``) restricts the run to one mode. In daemon
mode the test's daemon is stopped at teardown (and killed if it does not stop), so no
daemon outlives its test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import service

MODES = ("embedded", "daemon")


def selected_modes() -> list[str]:
    only = service.DEFAULT_MODE if "MC_TEST_SERVICE_MODE" in _initial_env else None
    return [only] if only in MODES else list(MODES)


_initial_env = dict(__import__("os").environ)


@pytest.fixture(autouse=True, params=selected_modes())
def service_mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    mode: str = request.param
    service.set_mode(mode)
    try:
        yield mode
    finally:
        service.set_mode(service.DEFAULT_MODE)
        if mode == "daemon":
            home = tmp_path / "mc-home"
            if home.exists():
                service.stop_daemon(home)
