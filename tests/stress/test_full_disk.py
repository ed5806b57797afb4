"""A full disk under MC_HOME: clean errors while full, everything works once space is back.

MC_HOME is a 2 MiB tmpfs (skipped, with the reason, where it cannot be mounted). After a
first turn the disk is filled to the last byte; then turns (on the existing session and
on new ones), ``session.create``, ``session.list``, ``session.replay`` and ``status``
must each answer (an error or a clean failed turn, never ``internal_error``, never a
hang) and the service must keep answering. After the filler is removed, turns on the
same session and on a new one complete, and replay shows them. No traceback anywhere.
Both service modes.
"""

from __future__ import annotations

import collections
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process.turn_support import replay_all, write_settings
from tests.stress.support import TIMEOUT, daemon_log, report, scaled, tracebacks
from tests.support import service
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess

pytestmark = pytest.mark.timeout(TIMEOUT)

PROMPT_S = 30.0
PROMPT = "p" * 16_000  # a user record far larger than the page slack left on a full disk


@pytest.fixture(params=["daemon", "embedded"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    service.set_mode(request.param)
    try:
        yield request.param
    finally:
        service.set_mode("daemon")


@pytest.fixture
def small_home(tmp_path: Path, mode: str) -> Iterator[Path]:
    """MC_HOME on its own 2 MiB tmpfs; its daemon is stopped before the unmount."""
    home = tmp_path / "mc-home-disk"
    home.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(home)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}"
        report(f"full_disk[{mode}]", skipped=repr(reason))
        pytest.skip(reason)
    try:
        yield home
    finally:
        for leftover in home.glob("filler*"):
            leftover.unlink()
        service.stop_daemon(home)
        if subprocess.run(["umount", str(home)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(home)], capture_output=True, check=False)


def _fill(home: Path) -> int:
    """Write filler files until not one more byte fits; returns the bytes they hold."""
    index = 0
    for size in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
        while True:
            path = home / f"filler{index}"
            try:
                with open(path, "ab") as f:
                    f.write(b"\0" * size)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                index += 1  # the failed file may hold a partial write: keep it, go smaller
                break
    free = os.statvfs(home)
    assert free.f_bavail == 0, f"{free.f_bavail} blocks still free"
    return sum(p.stat().st_size for p in home.glob("filler*"))


def _code(response: dict[str, Any]) -> str | None:
    error = response["error"]
    return None if error is None else str(error["code"])


async def _turn(
    svc: ServiceProcess, session_id: str | None, prompt: str = PROMPT
) -> tuple[str, str | None]:
    """("refused", code) or ("accepted", terminal status); the session in ``svc.last``."""
    response = await svc.request(
        "turn.start", {"prompt": prompt}, session_id=session_id, timeout=PROMPT_S
    )
    code = _code(response)
    if code is not None:
        return "refused", code
    svc.last_session = response["payload"]["session_id"]  # type: ignore[attr-defined]
    events = await svc.events_until_terminal(response["request_id"], timeout=PROMPT_S)
    return "accepted", events[-1]["payload"]["status"]


async def test_a_full_disk_gives_clean_errors_and_recovers(
    small_home: Path, project: Path, mode: str
) -> None:
    home = small_home
    rounds = scaled(1, 3)
    outcomes: collections.Counter[str] = collections.Counter()
    filled = []
    with FakeProviderServer() as fake:
        fake.set_default(Reply(text=["a" * 1000] * 8))  # 8 KB of assistant text per turn
        write_settings(home, fake)
        svc = await ServiceProcess.start(home, project)
        try:
            await svc.initialize()
            kind, status = await _turn(svc, None, "before the disk fills")
            assert (kind, status) == ("accepted", "completed")
            session_id = svc.last_session  # type: ignore[attr-defined]
            for _ in range(rounds):
                filled.append(_fill(home))
                # A small prompt may still fit the history's last page (its answer then
                # meets the full disk mid-turn); a big one cannot.
                for target, prompt in ((session_id, "small"), (session_id, PROMPT), (None, PROMPT)):
                    kind, result = await _turn(svc, target, prompt)
                    outcomes[f"turn.start:{kind}:{result}"] += 1
                    assert result != "internal_error"
                for method, sid in (
                    ("session.create", None),
                    ("session.list", None),
                    ("session.replay", session_id),
                    ("status", None),
                    ("capabilities", None),
                ):
                    response = await svc.request(method, session_id=sid, timeout=PROMPT_S)
                    code = _code(response)
                    outcomes[f"{method}:{code or 'ok'}"] += 1
                    assert code != "internal_error", response
                    if method in ("status", "capabilities", "session.replay", "session.list"):
                        assert code is None, response  # reading needs no space

                for leftover in home.glob("filler*"):
                    leftover.unlink()
                # Space is back: the same session and a new one take turns again.
                assert await _turn(svc, session_id, "after") == ("accepted", "completed")
                assert await _turn(svc, None, "new after") == ("accepted", "completed")
            items = await replay_all(svc, session_id)
            prompts = [i["text"] for i in items if i["kind"] == "message" and i["role"] == "user"]
            assert prompts[0] == "before the disk fills" and prompts[-1] == "after", prompts
            await svc.close_stdin()
            await svc.drain_stdout(PROMPT_S)
            code = await svc.wait(PROMPT_S)
            stderr = await svc.stderr_text()
        finally:
            await svc.stop()
    assert code == 0, stderr
    assert "Traceback" not in stderr, "\n".join(tracebacks(stderr))
    if mode == "daemon":
        log = daemon_log(home)
        assert "Traceback" not in log, "\n".join(tracebacks(log))
    report(
        f"full_disk[{mode}]",
        rounds=rounds,
        filled_bytes=",".join(map(str, filled)),
        answers=dict(sorted(outcomes.items())),
    )
