"""The ``grep`` tool's search, run in a worker process that cancellation can kill.

A Python regular expression cannot be interrupted once it runs (a catastrophic pattern
such as ``(a+)+$`` backtracks for minutes, holding the GIL in C code), so a search in a
thread would keep that thread busy after its call was cancelled. The tool instead runs
this module's source with ``python -I -S -X utf8 -c`` and kills the process on cancel or
timeout (``files.Grep``).

The module imports only the standard library: it is run from the source text the service
read when it imported ``files``, not imported from disk, so a worker started by a
long-running daemon searches exactly as the daemon's own code does, whatever files an
upgrade has put on disk since.

Protocol: one JSON object on stdin, ``{"pattern", "candidates": [[shown, path], ...],
"max_matches", "max_line_chars", "max_file_bytes", "max_total_bytes", "sniff_bytes"}``
(candidates already confined to the project by the caller, in order); one JSON string on
stdout, the tool's output text. JSON with ASCII escapes carries file names that are not
valid UTF-8 unchanged both ways.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Mapping


def search(request: Mapping[str, object]) -> str:
    """The tool output for ``request`` (see the module docstring)."""
    pattern = request["pattern"]
    candidates = request["candidates"]
    assert isinstance(pattern, str) and isinstance(candidates, list)
    max_matches = _number(request, "max_matches")
    max_line_chars = _number(request, "max_line_chars")
    max_total_bytes = _number(request, "max_total_bytes")
    regex = re.compile(pattern)
    results: list[str] = []
    total = 0
    note = ""
    for shown, path in candidates:
        data = read_searchable(path, _number(request, "max_file_bytes"), request)
        if data is None:
            continue
        total += len(data)
        if total > max_total_bytes:
            note = "[search stopped at its byte budget; narrow path or glob]"
            break
        for line_no, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
            if regex.search(line):
                results.append(f"{shown}:{line_no}:{line.rstrip(chr(13))[:max_line_chars]}")
                if len(results) >= max_matches:
                    break
        if len(results) >= max_matches:
            note = f"[stopped after {max_matches} matches; narrow the search]"
            break
    if not results:
        results.append("No matches.")
    if note:
        results.append(note)
    return "\n".join(results)


def read_searchable(path: str, max_file_bytes: int, request: Mapping[str, object]) -> bytes | None:
    """A searchable file's bytes; ``None`` for symlinks, binaries, huge or unreadable files."""
    try:
        # Symlinks are skipped: their target may be outside the project.
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_file_bytes:
            return None
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return None if b"\0" in data[: _number(request, "sniff_bytes")] else data


def _number(request: Mapping[str, object], key: str) -> int:
    value = request[key]
    assert isinstance(value, int)
    return value


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    sys.stdout.write(json.dumps(search(request)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
