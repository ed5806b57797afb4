"""Settings captures and settings writes never overlap within one service.

A persistent client's turn admission captures settings in the service's one preparation
worker (RFC-0002 §6.6). Captures and ``config.set`` writes are never interleaved, and a
capture never waits for another: whatever overlaps a running capture or write is refused
as ``configuration_busy`` rather than queued, so a turn never runs with half of a write.
Cross-process exclusion is the settings files' own locks; this gate covers the clients of
one service. Writes to different settings files (another connection's project, the
global file) may run at the same time (``core/configuration.py`` keeps one write per
file). A v1 client's turns do not capture at admission: their workers reload the
settings before provider execution, so they never pass this gate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from magi_code.protocol.errors import ErrorCode, ServiceError


class SettingsGate:
    def __init__(self) -> None:
        self._capturing = False
        self._writes = 0

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """The preparation worker; ``configuration_busy`` while it or a write runs."""
        if self._capturing or self._writes:
            raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
        self._capturing = True
        try:
            yield
        finally:
            self._capturing = False

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """One settings write; ``configuration_busy`` while a capture runs."""
        if self._capturing:
            raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
        self._writes += 1
        try:
            yield
        finally:
            self._writes -= 1
