"""A frontend that closes stdout mid-stream: the service stops with one diagnostic and exit
status 1, also while pipelined answers are being written together."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import orjson

from magi_code.protocol import envelope
from tests.support.service import service_env


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
