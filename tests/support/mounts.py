"""A mount table of the test's choosing, for code that asks ``storage.mounts`` whether a
path is on a local filesystem (what this machine's table says is not the test's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from magi_code.storage import mounts


def mount(point: str, kind: str, number: int = 30) -> str:
    """A ``/proc/self/mountinfo`` line mounting a ``kind`` filesystem at ``point`` (spaces
    escaped as the kernel does)."""
    point = point.replace(" ", "\\040")
    return f"{number} 1 0:{number} / {point} rw,relatime shared:1 - {kind} source rw"


def use_mountinfo(tmp_path: Path, lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``lines`` this process's mount table for the test."""
    path = tmp_path / "mountinfo"
    path.write_text("".join(f"{line}\n" for line in lines))
    monkeypatch.setattr(mounts, "MOUNTINFO", str(path))
    # The process-wide table opens its file once: make it open this one.
    monkeypatch.setattr(mounts.MOUNT_TABLE, "_fd", None)
    monkeypatch.setattr(mounts.MOUNT_TABLE, "_poller", None)
