"""FIFOs planted in session directories never wedge the real service (embedded and daemon).

Any same-user process (the agent's own shell tool included) can ``mkfifo`` where the
service expects ``history.jsonl``, ``meta.json`` or ``append.lock``. Listing, replay and
open must answer for that session at once (``session_unavailable``, or the list entry
skipped or flagged ``incomplete``), concurrent requests must not exhaust the workers,
``status`` keeps answering, and the process still exits 0 on stdin EOF.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.service import ServiceProcess, running_service, service_env

# Both modes: each mode checks its home at start-up and has its own workers and EOF.
pytestmark = pytest.mark.both_modes

# Generous bound for "answers promptly": a wedged service never answers at all.
PROMPT_S = 10.0


async def _created(service: ServiceProcess) -> str:
    created = await service.request("session.create")
    assert created["error"] is None, created
    session_id: str = created["payload"]["session_id"]
    closed = await service.request("session.close", session_id=session_id)
    assert closed["payload"]["status"] == "closed"
    return session_id


def _plant(home: Path, session_id: str, name: str, fifos: list[Path]) -> None:
    path = home / "sessions" / session_id / name
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o600)
    fifos.append(path)


def _code(response: dict[str, object]) -> object:
    error = response["error"]
    assert isinstance(error, dict), response
    return error["code"]


async def _replay_from_another_process(home: Path, project: Path, session_id: str) -> object:
    async with running_service(home, project) as other:
        reply = await other.request("session.replay", session_id=session_id, timeout=PROMPT_S)
        return _code(reply)


async def test_fifos_in_sessions_never_wedge_the_service(
    home: Path, project: Path, fifos: list[Path], service_mode: str
) -> None:
    async with running_service(home, project) as service:
        no_history = await _created(service)
        no_meta = await _created(service)
        no_lock = await _created(service)
        healthy = await _created(service)
        _plant(home, no_history, "history.jsonl", fifos)
        _plant(home, no_meta, "meta.json", fifos)
        _plant(home, no_lock, "append.lock", fifos)

        listing = await service.request("session.list", timeout=PROMPT_S)
        assert listing["error"] is None, listing
        payload = listing["payload"]
        entries = {s["session_id"]: s["title"] for s in payload["sessions"]}
        assert entries == {no_meta: None, no_lock: None, healthy: None}  # no history: skipped
        assert payload["incomplete"] is True

        for broken in (no_history, no_lock):
            replay = await service.request("session.replay", session_id=broken, timeout=PROMPT_S)
            assert _code(replay) == "session_unavailable"
            opened = await service.request("session.open", session_id=broken, timeout=PROMPT_S)
            assert _code(opened) == "session_unavailable"
        # The sidecar is display metadata: the session itself still works.
        replay = await service.request("session.replay", session_id=no_meta, timeout=PROMPT_S)
        assert replay["error"] is None, replay
        opened = await service.request("session.open", session_id=no_meta, timeout=PROMPT_S)
        assert opened["payload"] == {"session_id": no_meta, "status": "open"}

        # Many replays at once: pipelined on this connection, and one from each of eight
        # other service processes (in daemon mode all of them share the daemon's workers).
        rids = [service.next_id("replay") for _ in range(12)]
        for index, rid in enumerate(rids):
            broken = (no_history, no_lock)[index % 2]
            await service.send(
                {
                    "protocol_version": 1,
                    "kind": "request",
                    "request_id": rid,
                    "method": "session.replay",
                    "session_id": broken,
                    "payload": {},
                }
            )
        others = await asyncio.gather(
            *(
                _replay_from_another_process(home, project, (no_history, no_lock)[i % 2])
                for i in range(8)
            )
        )
        assert others == ["session_unavailable"] * 8
        for rid in rids:
            assert _code(await service.response_for(rid, PROMPT_S)) == "session_unavailable"

        status = await service.request("status", timeout=PROMPT_S)
        assert status["error"] is None, status
        healthy_replay = await service.request(
            "session.replay", session_id=healthy, timeout=PROMPT_S
        )
        assert healthy_replay["error"] is None, healthy_replay

        await service.close_stdin()
        await service.drain_stdout(PROMPT_S)
        assert await service.wait(PROMPT_S) == 0

    if service_mode == "daemon":
        stopped = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "magi_code", "daemon", "stop"],
            env=service_env(home),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert stopped.returncode == 0, stopped.stderr


async def _refusal(home: Path, project: Path) -> tuple[int, str]:
    service = await ServiceProcess.start(home, project)
    try:
        await service.close_stdin()
        code = await service.wait(PROMPT_S)
        return code, await service.stderr_text()
    finally:
        await service.stop()


async def test_a_home_others_can_write_is_refused_in_one_line(
    home: Path, project: Path, service_mode: str
) -> None:
    home.chmod(0o777)
    try:
        code, stderr = await _refusal(home, project)
    finally:
        home.chmod(0o700)
    assert code == 1
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("magi-code: "), stderr
    assert "writable" in lines[0]
    assert str(home) not in lines[0]  # stderr names no host path
    assert not (home / "sessions").exists()
    if service_mode == "embedded":
        assert list(home.iterdir()) == []  # refused before anything was written


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the home another owner")
async def test_a_home_owned_by_someone_else_is_refused(home: Path, project: Path) -> None:
    os.chown(home, 54321, 54321)
    code, stderr = await _refusal(home, project)
    assert code == 1
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert "54321" in stderr


async def test_a_symlinked_private_home_is_used_like_its_target(
    tmp_path: Path, project: Path
) -> None:
    target = tmp_path / "real-home"
    target.mkdir(mode=0o700)
    link = tmp_path / "linked-home"
    link.symlink_to(target)
    async with running_service(link, project) as service:
        session_id = await _created(service)
    assert (target / "sessions" / session_id / "history.jsonl").is_file()


async def test_a_missing_home_is_created_private(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "new" / "mc-home"
    async with running_service(home, project) as service:
        await _created(service)
    assert home.stat().st_mode & 0o077 == 0
    assert home.parent.stat().st_mode & 0o077 == 0
