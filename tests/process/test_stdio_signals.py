"""SIGTERM or SIGINT ends the service like EOF on stdin: answers already due are written,
the process exits with status 0 and stdout ends, while stdin is still open."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from tests.support.service import running_service

# Both modes: the stdio adapter and the shim each handle the signals.
pytestmark = pytest.mark.both_modes


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_while_waiting_for_input_ends_the_service(
    home: Path, project: Path, signum: signal.Signals
) -> None:
    async with running_service(home, project) as service:
        status = await service.request("status")
        assert status["error"] is None
        await asyncio.sleep(0.2)  # the service now waits for input that never comes
        service.proc.send_signal(signum)
        assert await asyncio.wait_for(service.proc.wait(), 20) == 0
        assert service.proc.stdout is not None
        assert await asyncio.wait_for(service.proc.stdout.read(), 20) == b""
