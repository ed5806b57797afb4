"""Scale, seeds, figures and process probes shared by the reliability suite.

``MC_STRESS=full`` (set by ``make stress``) selects the full counts; anything else runs the
short version that is part of the normal suite. ``MC_STRESS_SEED`` fixes the random
choices (every test prints the seed it used, so a failing run can be repeated). Both are
read at import, before the root conftest strips ``MC_*`` variables for the test itself.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from magi_code.client import Client
from magi_code.endpoint.lock import is_held
from tests.process.daemon.support import context, paths
from tests.support.fake_providers import FakeProviderServer, Reply, ScriptedReply

T = TypeVar("T")

FULL = os.environ.get("MC_STRESS", "short") == "full"
SCALE = "full" if FULL else "short"
SEED = int(os.environ.get("MC_STRESS_SEED") or time.time_ns() % 2**32)

# pytest-timeout per test: generous, a hang fails instead of blocking the suite.
TIMEOUT = 900 if FULL else 150

FIGURES: list[str] = []


def scaled(short: T, full: T) -> T:
    return full if FULL else short


def rng(name: str) -> random.Random:
    """A generator of its own for each test, derived from the run's seed."""
    return random.Random(f"{SEED}:{name}")


def report(name: str, **figures: object) -> str:
    """Record (and print, visible with ``-s``) one summary line for the run's figures."""
    fields = " ".join(f"{key}={value}" for key, value in figures.items())
    line = f"{name} [{SCALE} seed={SEED}]: {fields}"
    FIGURES.append(line)
    print(f"\n{line}")
    return line


# -- the daemon process ---------------------------------------------------------------------


@dataclass(frozen=True)
class ProcFigures:
    rss_kib: int
    fds: int
    threads: int

    def __str__(self) -> str:
        return f"rss={self.rss_kib / 1024:.1f}MiB/fds={self.fds}/threads={self.threads}"


def proc_figures(pid: int) -> ProcFigures:
    fields: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return ProcFigures(int(fields["VmRSS"].split()[0]), fds, int(fields["Threads"]))


def daemon_log(home: Path) -> str:
    """The daemon's log, rotated backups included (oldest first)."""
    log = paths(home).log
    parts = [log.with_name(f"{log.name}.{i}") for i in (3, 2, 1)] + [log]
    return "".join(p.read_text(errors="replace") for p in parts if p.exists())


def daemon_running(home: Path) -> bool:
    return is_held(paths(home).lock)


def daemons_of(home: Path) -> list[int]:
    """Pids of every live daemon process serving ``home`` (from /proc): ``magi-code daemon
    run``, or ``python -m magi_code.daemon`` as the on-demand starter spawns it."""
    wanted = f"MC_HOME={home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            on_demand = b"magi_code.daemon" in cmdline
            if not on_demand and (b"daemon" not in cmdline or b"run" not in cmdline):
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ and state != "Z":
            found.append(int(entry))
    return found


async def control_status(home: Path, project: Path) -> dict[str, Any]:
    """The daemon's ``status`` over a short-lived control connection (no autostart)."""
    client = await Client.connect(context(home, project), "control", autostart=False)
    try:
        return dict(await client.status())
    finally:
        await client.close()


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``predicate`` (a generous upper bound, never a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(0.05)


def tracebacks(text: str) -> list[str]:
    """Each distinct traceback in ``text``, as its innermost frame and its exception line."""
    found: dict[str, None] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("Traceback"):
            continue
        where = ""
        for follow in lines[i + 1 :]:
            if follow.startswith("  File "):
                where = follow.strip()
            elif not follow.startswith(" "):
                found[f"{where} -> {follow.strip()}"] = None
                break
    return list(found)


# -- a provider whose every answer names its prompt -----------------------------------------


def last_user_text(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in reversed(messages or []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "?"


class EchoProvider(FakeProviderServer):
    """Streams ``chunks`` deltas ``"<prompt>:<i> "``, one per ``delay`` seconds.

    Every turn's text is then unique and tells which prompt it answers, so the kill -9
    test can match each terminal to its turn in replay.
    """

    def __init__(self, chunks: int, delay: float) -> None:
        super().__init__()
        self.chunks = chunks
        self.delay = delay

    def _next_reply(self) -> ScriptedReply | None:
        # Called on the server's loop right after the request was recorded (no await
        # in between), so the last recorded request is the one being answered.
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            body = self._requests[-1].json if self._requests else None
        prompt = last_user_text(body)
        return Reply(text=[f"{prompt}:{i} " for i in range(self.chunks)], chunk_delay=self.delay)
