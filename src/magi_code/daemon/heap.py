"""Give the heap the C allocator keeps free back to the system once the daemon is quiet.

CPython hands back its small-object arenas when they empty, but every block over 512
bytes (read buffers, encoded answers, provider request bodies) comes from ``malloc``, and
glibc keeps what is freed in its arenas for reuse. So a daemon that runs for days would
stay near the peak of its busiest minute: after 64 clients that flooded requests and
never read were dropped, it kept ~104 MiB against ~37 MiB before. ``malloc_trim(0)``
returns the free pages of every arena.

When: after a connection or a turn ended (what frees memory), once no turn is running,
at most once per :data:`TRIM_INTERVAL_SECONDS`, in a worker thread (a trim of a ~200 MiB
heap takes ~2 ms), after a collection of the garbage in reference cycles. Only on
Linux, and a trim does nothing where the C library has no ``malloc_trim`` (musl);
elsewhere the daemon has no trimmer.

The daemon also keeps glibc to one arena for all its threads (``share_one_arena``), so
that its worker threads do not each keep a free heap of their own.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Final, cast

log = logging.getLogger("magi_code.daemon")

TRIM_INTERVAL_SECONDS: Final = 2.0
_STATM: Final = "/proc/self/statm"
_M_ARENA_MAX: Final = -8  # glibc's mallopt parameter: how many arenas malloc may create


class HeapTrimmer:
    """Told the daemon's connection and active-turn counts on every watch tick."""

    def __init__(
        self,
        trim: Callable[[], object],
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = TRIM_INTERVAL_SECONDS,
    ) -> None:
        self._trim = trim
        self._clock = clock
        self._interval = interval
        self._counts = (0, 0)
        self._pending = False
        self._next_at = -math.inf

    @classmethod
    def for_this_process(cls) -> HeapTrimmer | None:
        """A trimmer calling this process's ``malloc_trim``, or None without one."""
        if not sys.platform.startswith("linux"):
            return None
        return cls(_malloc_trim)

    async def tick(self, connections: int, active_turns: int) -> None:
        """Trim now (awaiting the worker thread) if something ended and it is due."""
        ended = connections < self._counts[0] or active_turns < self._counts[1]
        self._counts = (connections, active_turns)
        self._pending = self._pending or ended
        now = self._clock()
        if not self._pending or active_turns or now < self._next_at:
            return
        self._pending = False
        self._next_at = now + self._interval
        before = resident_bytes()
        await asyncio.to_thread(self._trim)
        after = resident_bytes()
        if before is not None and after is not None and before - after >= 8 << 20:
            log.info("returned free heap rss_mib=%.1f->%.1f", before / 2**20, after / 2**20)


def _malloc_trim() -> None:
    # What a turn leaves in reference cycles (httpx keeps each request, its body with it,
    # in one) waits for the cyclic collector, which may not run for long: collect it
    # first, so that the trim can return it too (~1-2 ms of a quiet daemon's heap).
    gc.collect()
    function = _resolve_malloc_trim()
    if function is not None:
        function(0)


@functools.cache
def _resolve_malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    # Not glibc (musl has none): nothing to trim.
    return _c_function("malloc_trim", ctypes.c_size_t)


def share_one_arena() -> None:
    """Have every thread of this process allocate from glibc's main arena.

    glibc gives each thread that allocates an arena of its own (up to eight per CPU).
    The daemon's worker threads (file I/O, parsing session windows) would each keep a
    free heap at their own high water, in holes too small for a trim to return, growing
    with the conversations they read. One arena shares that free space; the GIL already
    serializes nearly every allocation, so threads seldom wait for its lock. A thread
    keeps the arena it was given: call this before the first thread starts. Does
    nothing where the C library has no ``mallopt`` or another meaning for it (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    mallopt = _c_function("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, 1)


def _c_function(name: str, *argtypes: type) -> Callable[..., int] | None:
    """The C library's function ``name`` (returning an int), or None where it has none."""
    import ctypes

    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return cast(Callable[..., int], function)


def resident_bytes() -> int | None:
    """This process's resident set size, from ``/proc`` (None where there is none)."""
    try:
        with open(_STATM, "rb") as file:
            pages = int(file.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")
