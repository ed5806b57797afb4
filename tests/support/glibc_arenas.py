"""glibc's arenas other than the main one, found in a process's ``/proc/<pid>/maps``.

Each such arena is a heap that glibc maps anonymously at an address aligned to its
reservation (64 MiB on 64-bit), read-write as far as it is used and inaccessible for the
rest of the reservation. The main arena is the program break's heap (``[heap]``).
"""

from __future__ import annotations

from typing import Final

HEAP_RESERVATION: Final = 64 << 20


def secondary_arenas(maps: str) -> int:
    """How many glibc arenas besides the main one the ``maps`` text shows."""
    regions = []
    for line in maps.splitlines():
        fields = line.split()
        if not fields:
            continue
        start, end = (int(address, 16) for address in fields[0].split("-"))
        regions.append((start, end, fields[1], len(fields) > 5))
    count = 0
    for index, (start, end, perms, named) in enumerate(regions):
        if start % HEAP_RESERVATION or named or not perms.startswith("rw"):
            continue
        following = regions[index + 1] if index + 1 < len(regions) else None
        if following is not None and following[0] == end and following[2].startswith("---"):
            end = following[1]
        count += end - start == HEAP_RESERVATION
    return count
