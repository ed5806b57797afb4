"""The stdio shim forwards records as they arrive (a window of 32 in flight) and keeps v1's
order: a pipelining frontend reads through the shim exactly the bytes embedded mode
writes, a request ID is free again as soon as its answer was read, and the warm path of
``--app service`` imports no asyncio, uvloop, httpx or filelock, nor dataclasses, orjson
or hashlib.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson

from magi_code.protocol import envelope
from magi_code.protocol.limits import MAX_RECORD_BYTES
from tests.process.daemon.support import cli
from tests.support.service import ServiceProcess, service_env

EMBEDDED = {"MC_SERVICE_MODE": "embedded"}
# Top-level modules the warm shim never imports: the event loop and the HTTP stack, and
# what its launch context, frames and build identity once cost each start (dataclasses
# and what it imports, orjson and what it imports, OpenSSL). pathlib it does import: ~4
# ms, under a tenth of a warm start (docs/performance.md).
HEAVY = (
    "asyncio",
    "uvloop",
    "httpx",
    "filelock",
    "dataclasses",
    "inspect",
    "ast",
    "orjson",
    "uuid",
    "hashlib",
    "_hashlib",
)
# Product modules it never imports: the dataclass LaunchContext (it states its launch
# context as strings) and the starter (only a cold start needs it).
HEAVY_PRODUCT = ("magi_code.storage.launch", "magi_code.client.starter")


def _record(request_id: str, method: str, payload: dict[str, object] | None = None) -> bytes:
    return orjson.dumps(envelope.request(request_id, method, payload or {})) + b"\n"


INITIALIZE = _record("init", "initialize", {"supported_protocol_versions": [1]})
# One record over the v1 bound: answered ``record_too_large`` in its place.
OVERSIZE = b'{"padding":"' + b"x" * MAX_RECORD_BYTES + b'"}\n'


def _padded_status(request_id: str) -> bytes:
    """A ``status`` request of exactly the record bound (spaces before its last brace)."""
    body = orjson.dumps(envelope.request(request_id, "status", {}))
    return body[:-1] + b" " * (MAX_RECORD_BYTES - len(body) - 1) + b"}\n"


async def _exchange(
    svc: ServiceProcess, batches: list[tuple[bytes, int]], timeout: float = 60
) -> list[bytes]:
    """Write each batch at once (while reading), and read its ``count`` answer lines before
    the next batch is written; every line read, in order."""
    assert svc.proc.stdin is not None and svc.proc.stdout is not None
    stdout = svc.proc.stdout
    lines: list[bytes] = []
    for data, count in batches:
        writer = asyncio.create_task(svc.send_raw(data))
        async with asyncio.timeout(timeout):
            for _ in range(count):
                line = await stdout.readline()
                assert line.endswith(b"\n"), (len(lines), line)
                lines.append(line)
            await writer
    return lines


async def _both_modes(
    home: Path, project: Path, batches: list[tuple[bytes, int]]
) -> tuple[list[bytes], list[bytes]]:
    """The same exchange with an embedded service and with a shim (daemon mode)."""
    outputs: list[list[bytes]] = []
    for env in (EMBEDDED, None):
        svc = await ServiceProcess.start(home, project, env)
        try:
            outputs.append(await _exchange(svc, batches))
            await svc.close_stdin()
            assert await svc.wait(30) == 0, await svc.stderr_text()
        finally:
            await svc.stop()
    return outputs[0], outputs[1]


def _ids(lines: list[bytes]) -> list[str | None]:
    return [orjson.loads(line)["request_id"] for line in lines]


async def test_500_status_requests_written_at_once_read_as_in_embedded_mode(
    home: Path, project: Path
) -> None:
    count = 500
    batch = INITIALIZE + b"".join(_record(f"s{i}", "status") for i in range(count))
    embedded, shim = await _both_modes(home, project, [(batch, count + 1)])
    assert _ids(shim) == ["init"] + [f"s{i}" for i in range(count)]
    assert shim == embedded


async def test_a_reused_request_id_an_oversize_record_and_crlf_in_a_pipelined_stream(
    home: Path, project: Path
) -> None:
    # ``config.get`` is answered by a worker (the daemon says ``next`` and goes on), so its
    # ID is only free once the shim acknowledged the answer's write: the record that
    # reuses it, read after that answer, must reach the daemon after the acknowledgement.
    first = (
        INITIALIZE
        + b"".join(_record(f"a{i}", "status") for i in range(60))
        + _record("dup", "config.get")
    )
    again = _record("dup", "config.get")
    mixed = (
        b"".join(_record(f"b{i}", "status") for i in range(40))
        + OVERSIZE
        + _record("crlf", "status")[:-1]
        + b"\r\n"
        + b"".join(_record(f"c{i}", "status") for i in range(40))
        + _record("dup", "status")
    )
    batches = [(first, 62), (again, 1), (mixed, 83)]
    embedded, shim = await _both_modes(home, project, batches)
    answers = [orjson.loads(line) for line in shim]
    assert [a["request_id"] for a in answers[61:63]] == ["dup", "dup"]
    assert all(a["error"] is None for a in answers[:63]), answers[:63]
    too_large = answers[63 + 40]
    assert too_large["request_id"] is None
    assert too_large["error"]["code"] == "record_too_large"
    assert answers[63 + 41]["request_id"] == "crlf" and answers[-1]["request_id"] == "dup"
    assert answers[-1]["error"] is None
    assert shim == embedded


async def test_records_at_the_size_bound_fill_the_window_without_stalling_the_daemon(
    home: Path, project: Path
) -> None:
    # 48 records of 64 KiB: 3 MiB in flight if the window counted records only, three
    # times the daemon's inbox bound (whose reading would pause with the answers' acks
    # unread behind the records).
    count = 48
    batch = INITIALIZE + b"".join(_padded_status(f"big{i}") for i in range(count))
    svc = await ServiceProcess.start(home, project)
    try:
        lines = await _exchange(svc, [(batch, count + 1)], timeout=30)
        assert _ids(lines) == ["init"] + [f"big{i}" for i in range(count)]
        assert all(orjson.loads(line)["error"] is None for line in lines)
    finally:
        await svc.stop()


async def test_a_frontend_that_closes_stdout_while_pipelining_ends_the_shim_as_embedded(
    home: Path, project: Path
) -> None:
    codes: list[int] = []
    errors: list[list[str]] = []
    for env in (EMBEDDED, None):
        read_fd, write_fd = os.pipe()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "magi_code",
            "--app",
            "service",
            stdin=asyncio.subprocess.PIPE,
            stdout=write_fd,
            stderr=asyncio.subprocess.PIPE,
            cwd=project,
            env=service_env(home, env),
        )
        os.close(write_fd)
        try:
            with os.fdopen(read_fd, "rb", buffering=0) as out:
                assert proc.stdin is not None
                proc.stdin.write(INITIALIZE)
                await proc.stdin.drain()
                assert b'"init"' in await asyncio.to_thread(out.readline)
            # The frontend stopped reading: its end of stdout is closed.
            proc.stdin.write(b"".join(_record(f"s{i}", "status") for i in range(200)))
            await proc.stdin.drain()
            codes.append(await asyncio.wait_for(proc.wait(), 30))
            assert proc.stderr is not None
            stderr = (await proc.stderr.read()).decode()
            errors.append([line for line in stderr.splitlines() if line.startswith("magi-code:")])
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert codes == [1, 1]
    assert errors[1] == errors[0] == ["magi-code: output error: stdout closed; stopping"]


def test_the_warm_shim_imports_none_of_the_heavy_modules(home: Path, project: Path) -> None:
    assert cli(home, "daemon", "start").returncode == 0
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "magi_code", "--app", "service"],
        input=INITIALIZE + _record("s", "status"),
        capture_output=True,
        cwd=project,
        env=service_env(home),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert _ids(proc.stdout.splitlines()) == ["init", "s"]
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.decode().splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "magi_code.shim.bridge" in imported and "msgpack" in imported  # the parse works
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    assert heavy == []
    assert sorted(set(HEAVY_PRODUCT) & imported) == []
