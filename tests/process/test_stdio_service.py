"""The real stdio process: framing recovery, fuzzing, argument rules, stream ownership."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from magi_code.protocol import envelope
from magi_code.protocol.limits import MAX_ID_BYTES
from tests.support.service import ServiceProcess, running_service, service_env


# Both modes: framing is the stdio adapter's (embedded) or the shim's and daemon's.
@pytest.mark.both_modes
async def test_random_byte_records_are_each_answered_and_the_loop_continues(
    home: Path, project: Path
) -> None:
    rng = random.Random(20261202)
    records: list[bytes] = []
    for _ in range(300):
        kind = rng.randrange(5)
        if kind == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        elif kind == 1:
            body = b"[" * rng.randrange(1, 5000)
        elif kind == 2:
            body = (
                b'{"protocol_version":1,"kind":"request","request_id":"'
                + b"x" * rng.randrange(0, 300)
                + b'","method":"status","payload":'
                + rng.choice([b"{}", b"[]", b"null", b"1"])
            )
        elif kind == 3:
            body = orjson.dumps({"a": "z" * rng.randrange(0, 20000)})
        else:
            body = orjson.dumps(rng.choice([None, 1, "s", [1], {"kind": "request"}]))
        records.append(body.replace(b"\n", b" ").replace(b"\r", b" "))
    stream = b"".join(r + b"\n" for r in records)
    service = await ServiceProcess.start(home, project)
    try:
        await service.send_raw(stream)
        for _ in records:
            message = await service.recv()
            assert message["kind"] == "response"
            assert message["payload"] is None
            assert message["error"]["code"]
        await service.initialize()
        status = await service.request("status")
        assert status["payload"] == {"service": "ready", "provider_auth_ready": False}
    finally:
        await service.stop()


# Both modes: EOF is the stdio adapter's (embedded) or the shim's.
@pytest.mark.both_modes
async def test_eof_ends_the_service_cleanly_with_only_jsonl_on_stdout(
    home: Path, project: Path
) -> None:
    service = await ServiceProcess.start(home, project)
    await service.send_raw(b"not json\n")
    await service.close_stdin()
    rest = await service.drain_stdout()
    assert [m["error"]["code"] for m in rest] == ["invalid_json"]
    assert await service.wait() == 0


# Both modes: the bounds are enforced by the stdio adapter (embedded) or the daemon itself.
@pytest.mark.both_modes
async def test_every_id_field_is_held_to_the_id_bound(home: Path, project: Path) -> None:
    long_id = "t" * 200
    async with running_service(home, project) as service:
        # Envelope IDs: neither an over-long request ID nor session ID is echoed back.
        await service.send(envelope.request(long_id, "status"))
        answer = await service.recv()
        assert answer["request_id"] is None
        assert answer["error"]["code"] == "limit_exceeded"
        opened = await service.request("session.open", session_id=long_id)
        assert opened["session_id"] is None
        assert opened["error"]["code"] == "limit_exceeded"
        # Payload IDs get the same error (not "unknown"), at any length past the bound.
        for method, payload in (
            ("turn.cancel", {"turn_id": long_id}),
            ("turn.cancel", {"turn_id": "é" * (MAX_ID_BYTES // 2 + 1)}),
            ("auth.login.cancel", {"login_id": long_id}),
            ("auth.login.callback", {"login_id": long_id, "input": "code"}),
        ):
            refused = await service.request(method, payload)
            assert refused["error"]["code"] == "limit_exceeded", (method, refused)
        # At the bound an ID is looked up like any other.
        at_bound = await service.request("turn.cancel", {"turn_id": "t" * MAX_ID_BYTES})
        assert at_bound["error"]["code"] == "unknown_turn"
        login = await service.request("auth.login.cancel", {"login_id": "l" * MAX_ID_BYTES})
        assert login["error"]["code"] == "unknown_login"


# Both modes: stdout is written by the stdio adapter (embedded) or the shim.
@pytest.mark.both_modes
def test_output_to_a_regular_file_works(home: Path, project: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with out.open("wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "magi_code", "--app", "service"],
            input=b'{"protocol_version":1,"kind":"request","request_id":"a","method":"status",'
            b'"payload":{}}\n',
            stdout=fh,
            stderr=subprocess.PIPE,
            cwd=project,
            env=service_env(home),
            timeout=30,
            check=False,
        )
    assert proc.returncode == 0
    lines = out.read_bytes().splitlines()
    assert [orjson.loads(line)["error"]["code"] for line in lines] == ["not_initialized"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--prompt", "hi"],
        ["--provider", "anthropic"],
        ["--model", "m"],
        ["--session", "s"],
        ["--api-key", "k"],
        ["--theme", "dark"],
        ["daemon", "start"],
    ],
)
def test_app_service_refuses_forbidden_combinations(
    extra: list[str], home: Path, project: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "magi_code", "--app", "service", *extra],
        input=b"",
        capture_output=True,
        cwd=project,
        env=service_env(home),
        timeout=30,
        check=False,
    )
    assert proc.returncode != 0
    assert proc.stdout == b""
    assert b"--app service" in proc.stderr


# Both modes: the signal is handled by the stdio adapter (embedded) or the shim.
@pytest.mark.both_modes
async def test_sigterm_behaves_like_eof(home: Path, project: Path) -> None:
    service = await ServiceProcess.start(home, project)
    try:
        await service.initialize()
        service.proc.terminate()
        assert await asyncio.wait_for(service.proc.wait(), 20) == 0
    finally:
        await service.stop()
