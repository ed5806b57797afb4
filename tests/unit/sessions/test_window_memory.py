"""What a session window holds in memory once parsed, and once projected for a replay.

A window is up to 2 MiB of history, and the daemon keeps several (the window cache):
parsed and projected, they must stay within a small multiple of their bytes.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

from window_lines import HEADER, SESSION, turn

from magi_code.sessions.projection import parse_window, project

T = TypeVar("T")


def traced(make: Callable[[], T]) -> tuple[T, int, int]:
    """What ``make`` returns, the traced memory it still holds, and its peak."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = make()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return value, held - before, peak - before


def window_bytes(turns: int) -> bytes:
    lines = (line for n in range(turns) for line in turn(1 + 5 * n, f"turn_{n:08d}", f"r{n}"))
    return b"".join([HEADER, *lines])


def test_a_parse_holds_little_besides_what_it_returns() -> None:
    """The lines are decoded one at a time: a parse's peak is its window's bytes and the
    records it returns, not also every line of the window as an object of its own."""
    data = window_bytes(400)
    window, held, peak = traced(lambda: parse_window(data, 0, SESSION))
    assert len(window.records) == 2001
    # Splitting the window first would add about its own size again.
    assert peak - held < len(data) // 4, (peak, held, len(data))


def test_a_projection_holds_about_its_windows_size() -> None:
    """An item keeps its body's values, not a dictionary and a digest of its own, and
    the projection no map of every text: less than twice the window's bytes (~1.2 times;
    ~2.8 times before)."""
    data = window_bytes(400)
    window = parse_window(data, 0, SESSION)
    projection, held, _ = traced(lambda: project(window.records))
    assert len(projection.items) == 1200  # a prompt, a reply and a terminal a turn
    assert held < 2 * len(data), (held, len(data))
