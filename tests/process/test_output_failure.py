"""A frontend that closes stdout mid-stream: the service stops with one diagnostic and exit
status 1, also while it pipelines requests, and no request read behind an answer that
could not be written has taken effect."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from magi_code.protocol import envelope
from tests.support.service import running_service, service_env

# Both modes: the stdio adapter and the shim each handle a closed stdout.
pytestmark = pytest.mark.both_modes


def test_a_closed_stdout_stops_the_service_with_status_1(home: Path, project: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "magi_code", "--app", "service"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=project,
        env=service_env(home),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    init = envelope.request("init", "initialize", {"supported_protocol_versions": [1]})
    proc.stdin.write(orjson.dumps(init) + b"\n")
    proc.stdin.flush()
    assert orjson.loads(proc.stdout.readline())["request_id"] == "init"
    proc.stdout.close()  # the frontend is gone; stdin stays open

    def feed() -> None:
        # Keep pipelining requests until the service stops reading (it exits).
        record = b"".join(
            orjson.dumps(envelope.request(f"r{i}", "status")) + b"\n" for i in range(500)
        )
        try:
            for _ in range(200):
                proc.stdin.write(record)
                proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    feeder.join(10)
    stderr = proc.stderr.read().decode()
    assert stderr.count("output error: stdout closed; stopping") == 1, stderr
    proc.stderr.close()
    try:
        proc.stdin.close()
    except BrokenPipeError:
        pass


async def test_requests_read_behind_an_unwritten_answer_take_no_effect(
    home: Path, project: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "magi_code", "--app", "service"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=project,
        env=service_env(home),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        init = envelope.request("init", "initialize", {"supported_protocol_versions": [1]})
        proc.stdin.write(orjson.dumps(init) + b"\n")
        proc.stdin.flush()
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert orjson.loads(line)["request_id"] == "init"
        proc.stdout.close()  # the frontend is gone: the next answer cannot be written
        pipelined = [
            envelope.request("s", "status"),
            envelope.request("set", "config.set", {"scope": "global", "fast": True}),
            envelope.request("create", "session.create"),
        ]
        proc.stdin.write(b"".join(orjson.dumps(r) + b"\n" for r in pipelined))
        proc.stdin.flush()
        assert await asyncio.wait_for(asyncio.to_thread(proc.wait), 60) == 1
        stderr = proc.stderr.read().decode()
        assert stderr.count("output error: stdout closed; stopping") == 1, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    # Neither the setting nor the session exists for a fresh service.
    assert not (home / "settings.json").exists()
    async with running_service(home, project) as fresh:
        config = await fresh.request("config.get")
        assert config["payload"]["fast"] is False
        listed = await fresh.request("session.list")
        assert listed["payload"]["sessions"] == []
