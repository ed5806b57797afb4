"""Settings captures and settings writes never overlap within one service.

Turn admission captures settings through one preparation worker: captures queue behind
each other (they take milliseconds). A ``config.set`` write and a capture are never
interleaved: whichever comes second is refused as ``configuration_busy`` rather than
queued, so a turn never runs with half of a write. Cross-process exclusion is the
settings files' own locks; this gate covers the clients of one service. Writes to
different settings files (another connection's project, the global file) may run at
the same time (``core/configuration.py`` keeps one write per file); a capture waits for
none of them and is refused while any runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from magi_code.protocol.errors import ErrorCode, ServiceError


class SettingsGate:
    def __init__(self) -> None:
        self._preparation = asyncio.Lock()
        self._writes = 0

    @contextlib.asynccontextmanager
    async def capture(self) -> AsyncIterator[None]:
        """The preparation worker's slot; ``configuration_busy`` while a write runs."""
        if self._writes:
            raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
        async with self._preparation:
            if self._writes:
                raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
            yield

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """One settings write; ``configuration_busy`` while a capture runs."""
        if self._preparation.locked():
            raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
        self._writes += 1
        try:
            yield
        finally:
            self._writes -= 1

    @property
    def writing(self) -> bool:
        return self._writes > 0
