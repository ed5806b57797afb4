"""The service-mode matrix of the contract and process tests.

A test runs in the product's default mode (daemon through the shim) unless it is marked
``@pytest.mark.both_modes`` (a test, a class, or a module's ``pytestmark``): then it
runs embedded and via the daemon. Mark what the two modes do differently: transport and
framing, start-up, lifetime and crashes, permissions and the launch environment, output
failure, signals, stdin EOF, and anything the embedded adapter implements apart from the
daemon's v1 role. Behaviour of the shared core (turns, tools, agent) runs once.

``MC_TEST_SERVICE_MODE=embedded`` (or ``daemon``) runs every test in that one mode (the
way to run an unmarked test embedded: its embedded copy is not collected otherwise). In
daemon mode the test's daemons are stopped at teardown (and killed if they do not stop),
so no daemon outlives its test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import service

MODES = ("embedded", "daemon")
# What users get: the default of ``MC_SERVICE_MODE``.
PRODUCT_MODE = "daemon"
MARKER = "both_modes"

_OVERRIDE = os.environ.get("MC_TEST_SERVICE_MODE")


def selected_modes() -> list[str]:
    return [_OVERRIDE] if _OVERRIDE in MODES else list(MODES)


@pytest.fixture(autouse=True, params=selected_modes())
def service_mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    mode: str = request.param
    service.set_mode(mode)
    try:
        yield mode
    finally:
        service.set_mode(service.DEFAULT_MODE)
        if mode == "daemon":
            service.stop_daemons(tmp_path)


def runs_in_this_mode(item: pytest.Item) -> bool:
    """False for the copy of an unmarked test in a mode other than the product's."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "service_mode" not in callspec.params:
        return True
    if len(selected_modes()) == 1 or item.get_closest_marker(MARKER) is not None:
        return True
    return bool(callspec.params["service_mode"] == PRODUCT_MODE)
