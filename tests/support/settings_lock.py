"""Another process holding a settings file's lock, as a settings writer does."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

_HOLDER = """
import sys
from pathlib import Path
from magi_code.storage.files import locked
with locked(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


class HeldLock:
    def __init__(self, settings_file: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(settings_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "held":
            self.release()
            raise AssertionError("the lock holder did not take the lock")

    def release(self) -> None:
        """Let go of the lock (the holder exits); idempotent."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@contextlib.contextmanager
def settings_lock_held(settings_file: Path) -> Iterator[HeldLock]:
    """``settings_file``'s lock held by another process until ``release()`` or the end."""
    held = HeldLock(settings_file)
    try:
        yield held
    finally:
        held.release()
