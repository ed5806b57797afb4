"""Output still buffered when stdin ends is written before the service exits.

The frontend stops reading stdout for a while (its pipe is full), sends more requests,
closes stdin, and only then reads: every answer must arrive, whole, and the exit is 0.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from magi_code.protocol import envelope
from tests.support.service import service_env

# Both modes: the stdio adapter and the shim each write their own output at exit.
pytestmark = pytest.mark.both_modes

F_SETPIPE_SZ = 1031


def test_every_answer_queued_before_eof_reaches_a_slow_reader(home: Path, project: Path) -> None:
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)  # a small pipe fills at once
    proc = subprocess.Popen(
        [sys.executable, "-m", "magi_code", "--app", "service"],
        stdin=subprocess.PIPE,
        stdout=write_fd,
        stderr=subprocess.DEVNULL,
        cwd=project,
        env=service_env(home),
    )
    os.close(write_fd)
    count = 300
    records = [envelope.request("init", "initialize", {"supported_protocol_versions": [1]})]
    records += [envelope.request(f"r{i}", "capabilities", {}) for i in range(count)]
    assert proc.stdin is not None
    writer = threading.Thread(
        target=lambda: (
            proc.stdin.write(b"".join(orjson.dumps(r) + b"\n" for r in records)),
            proc.stdin.close(),
        ),
    )
    writer.start()
    writer.join(60)  # every request fits the stdin pipe: written and closed while stdout is full
    data = b""
    with os.fdopen(read_fd, "rb", buffering=0) as out:
        # A slow reader: the service reaches EOF while its last answers are still queued.
        while chunk := out.read(4096):
            data += chunk
            time.sleep(0.002)
    assert proc.wait(60) == 0
    lines = data.split(b"\n")
    assert lines[-1] == b""
    answered = [orjson.loads(line)["request_id"] for line in lines[:-1]]
    assert answered == ["init"] + [f"r{i}" for i in range(count)]
