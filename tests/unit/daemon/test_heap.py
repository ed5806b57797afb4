"""When the daemon gives its free heap back: after something ended, with no turn
running, at most once per interval, off the event loop."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading

import pytest
from tests.support.glibc_arenas import secondary_arenas

from magi_code.daemon.heap import HeapTrimmer, resident_bytes


class Trims:
    def __init__(self) -> None:
        self.threads: list[int] = []

    def __call__(self) -> None:
        self.threads.append(threading.get_ident())

    @property
    def count(self) -> int:
        return len(self.threads)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def trimmer(interval: float = 10.0) -> tuple[HeapTrimmer, Trims, Clock]:
    trims, clock = Trims(), Clock()
    return HeapTrimmer(trims, clock=clock, interval=interval), trims, clock


async def test_nothing_is_trimmed_until_a_connection_or_turn_ends() -> None:
    heap, trims, _ = trimmer()
    for connections in (1, 2, 3, 3, 3):
        await heap.tick(connections, 0)
    assert trims.count == 0
    await heap.tick(2, 0)  # a connection closed
    assert trims.count == 1
    assert trims.threads[0] != threading.get_ident(), "the trim ran on the event loop"


async def test_an_ended_turn_is_trimmed_after_once_no_turn_runs() -> None:
    heap, trims, _ = trimmer()
    await heap.tick(1, 2)
    await heap.tick(1, 1)  # one of two turns ended: the other still runs
    await heap.tick(1, 1)
    assert trims.count == 0
    await heap.tick(1, 0)
    assert trims.count == 1
    await heap.tick(1, 0)  # nothing ended since
    assert trims.count == 1


async def test_at_most_one_trim_per_interval_and_a_later_end_is_not_forgotten() -> None:
    heap, trims, clock = trimmer(interval=10.0)
    await heap.tick(3, 0)
    await heap.tick(2, 0)
    assert trims.count == 1
    clock.now += 4
    await heap.tick(1, 0)  # ended again, too soon
    assert trims.count == 1
    clock.now += 5.9
    await heap.tick(1, 0)
    assert trims.count == 1
    clock.now += 0.1
    await heap.tick(1, 0)  # the interval is over: the end 6 s ago is served now
    assert trims.count == 2
    clock.now += 60
    await heap.tick(1, 0)
    assert trims.count == 2


def python_output(code: str) -> str:
    """What a new interpreter running ``code`` printed."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


def resident_around_a_trim(setup: str) -> tuple[int, int]:
    """A new process's RSS after ``setup`` ran, and after its trimmer's first trim."""
    code = (
        "import asyncio, gc\n"
        "from magi_code.daemon.heap import HeapTrimmer, resident_bytes\n"
        f"{setup}"
        "before = resident_bytes()\n"
        "heap = HeapTrimmer.for_this_process()\n"
        "async def main():\n"
        "    await heap.tick(1, 0)\n"
        "    await heap.tick(0, 0)\n"
        "asyncio.run(main())\n"
        "print(before, resident_bytes())\n"
    )
    before, after = map(int, python_output(code).split())
    return before, after


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_gives_back_what_was_freed_but_kept() -> None:
    # 80 MB of 4 KB blocks, one in a hundred kept: glibc keeps the rest for reuse.
    freed, trimmed = resident_around_a_trim(
        "blocks = [bytes(4000) + bytes([i % 256]) for i in range(20000)]\n"
        "kept = blocks[::100]\n"
        "del blocks\n"
    )
    assert freed - trimmed > 40 * 2**20, (freed, trimmed)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trim_gives_back_what_reference_cycles_held() -> None:
    # 80 MB held by objects in reference cycles (as httpx keeps a request and its body):
    # unreachable, but freed only by the cyclic collector, which the trim runs first.
    unreachable, trimmed = resident_around_a_trim(
        "gc.disable()\n"
        "class Node:\n"
        "    def __init__(self, i):\n"
        "        self.body = bytes(4000) + bytes([i % 256])\n"
        "        self.me = self\n"
        "nodes = [Node(i) for i in range(20000)]\n"
        "del nodes\n"
    )
    assert unreachable - trimmed > 40 * 2**20, (unreachable, trimmed)


def arenas_after_threads_allocate(share: bool) -> int:
    """glibc's arenas besides the main one in a new process whose four threads, alive at
    once, each allocated blocks too large for CPython's own allocator."""
    code = (
        "import threading\n"
        "from magi_code.daemon.heap import share_one_arena\n"
        f"{'share_one_arena()' if share else ''}\n"
        "together = threading.Barrier(4)\n"
        "def allocate():\n"
        "    kept = [bytearray(100_000) for _ in range(8)]\n"
        "    together.wait()\n"
        "threads = [threading.Thread(target=allocate) for _ in range(4)]\n"
        "for thread in threads: thread.start()\n"
        "for thread in threads: thread.join()\n"
        "print(open('/proc/self/maps').read())\n"
    )
    return secondary_arenas(python_output(code))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="arenas are glibc's")
def test_threads_share_one_arena() -> None:
    # Each thread would otherwise get an arena of its own, with its own free heap.
    assert arenas_after_threads_allocate(share=False) >= 1
    assert arenas_after_threads_allocate(share=True) == 0


@pytest.mark.skipif(sys.platform.startswith("linux"), reason="the other platforms")
def test_elsewhere_there_is_no_trimmer() -> None:
    assert HeapTrimmer.for_this_process() is None
    assert os.path.exists("/proc/self/statm") or resident_bytes() is None
