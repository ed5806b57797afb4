"""Random and mutated input on the real socket and on the shim's stdin.

v2: many connections send random bytes, truncated frames, huge headers, invalid or
hostile msgpack, random frames of known and unknown types and mutated valid frames,
before or after a hello of each role, in random chunks, then read a little and close
(some with a reset). v1: ``magi-code --app service`` gets random byte lines, invalid
UTF-8, oversize records, deep nesting and mutated envelopes on stdin. Afterwards the same
daemon still answers ``status``, holds no client, and its log has no traceback; every
stdout line of the shims was one JSON record and each shim exited 0.

Nothing sent can stop the daemon or leave the machine: ``control`` frames never carry
``stop``, mutated v1 methods are never ``auth.*``/``config.*``, and turns go to a
loopback fake provider.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest

from magi_code.client import socket_for
from magi_code.client.channel import launch_of
from magi_code.protocol import envelope
from magi_code.protocol.frames import MAX_FRAME_BYTES, FrameDecoder, FrameError, encode_frame
from magi_code.protocol.v2 import hello
from tests.process.daemon.support import cli, context, status
from tests.process.turn_support import write_settings
from tests.stress.support import (
    TIMEOUT,
    control_status,
    daemon_log,
    proc_figures,
    report,
    rng,
    scaled,
    tracebacks,
    wait_until,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess

pytestmark = pytest.mark.timeout(TIMEOUT)

FAST = {"MC_DAEMON_CLIENT_TIMEOUT_SECONDS": "2"}
FRAME_TYPES = [
    "hello",
    "request",
    "take_control",
    "control",
    "snapshot",
    "attach",
    "record",
    "oversize",
    "written",
    "output_failed",
    "eof",
    "welcome",
    "message",
    "error",
    "refused",
]
FIELDS = [
    "id",
    "op",
    "session_id",
    "turn_id",
    "turn_ids",
    "after_sequence",
    "cursor",
    "project_dir",
    "message",
    "deadline_ms",
    "idempotency_key",
    "data",
    "seq",
    "role",
    "launch",
    "protocol_versions",
    "options",
]
SAFE_METHODS = [
    "initialize",
    "status",
    "capabilities",
    "session.list",
    "session.create",
    "session.open",
    "session.replay",
    "session.close",
    "turn.start",
    "turn.cancel",
]


# -- random values and frames -------------------------------------------------------------


def _text(r: random.Random, limit: int = 40) -> str:
    alphabet = "aZ09_-.:/ \t\n\"'\\{}[]ü€𝄞\x00\x7f"
    return "".join(r.choice(alphabet) for _ in range(r.randint(0, limit)))


def _value(r: random.Random, depth: int = 0, *, json: bool = False) -> Any:
    """A random msgpack value (``json``: one JSON can carry: no bytes, 64-bit ints)."""
    kind = r.randrange(10 if depth < 4 else 7)
    if json and kind == 5:
        kind = 4
    if kind == 0:
        return None
    if kind == 1:
        return r.choice([True, False])
    if kind == 2:
        return r.choice([0, -1, 1, 2**31, 2**53, 2**63 - 1, -(2**63), r.randint(-1000, 10**6)])
    if kind == 3:
        return r.choice([0.5, -0.0, float("inf"), float("nan"), 1e308])
    if kind == 4:
        return _text(r)
    if kind == 5:
        return r.randbytes(r.randint(0, 64))
    if kind == 6:
        return r.choice(["ses_" + "0" * 26, "turn-1", "", "x" * 200, "../etc", "-rf"])
    if kind in (7, 8):
        return [_value(r, depth + 1, json=json) for _ in range(r.randint(0, 5))]
    return {_text(r, 10): _value(r, depth + 1, json=json) for _ in range(r.randint(0, 5))}


def _safe(frame: dict[str, Any]) -> dict[str, Any]:
    """Never ask the daemon to stop (a persistent or control connection may)."""
    if frame.get("op") == "stop":
        frame["op"] = "stats"
    message = frame.get("message")
    if isinstance(message, dict):
        method = message.get("method")
        if isinstance(method, str) and method.startswith(("auth.", "config.")):
            message["method"] = "status"
    return frame


def _v1_request(r: random.Random) -> dict[str, Any]:
    method = r.choice(SAFE_METHODS)
    payload: dict[str, Any] = {}
    if method == "initialize":
        payload = {"supported_protocol_versions": [1]}
    elif method == "turn.start":
        payload = {"prompt": _text(r, 80)}
    elif r.random() < 0.5:
        payload = {_text(r, 8): _value(r, json=True) for _ in range(r.randint(0, 3))}
    session_id = r.choice([None, None, "ses_" + "a" * 26, _text(r, 20)])
    return envelope.request(f"fz-{r.randrange(50)}", method, payload, session_id)


def _valid_frame(r: random.Random, home: Path, project: Path) -> dict[str, Any]:
    kind = r.randrange(7)
    if kind == 0:
        frame: dict[str, Any] = {"t": "request", "message": _v1_request(r)}
        if r.random() < 0.3:
            frame["idempotency_key"] = r.choice(["k:1", "k 2", "", "x" * 70])
        if r.random() < 0.3:
            frame["deadline_ms"] = r.choice([0, 2**62, -5, "soon"])
        return frame
    if kind == 1:
        return {"t": "attach", "id": r.randrange(9), "turn_id": _text(r, 30), "after_sequence": -1}
    if kind == 2:
        return {"t": "snapshot", "id": r.randrange(9), "turn_ids": [_text(r, 10)]}
    if kind == 3:
        return {"t": "take_control", "id": r.randrange(9), "session_id": "ses_" + "b" * 26}
    if kind == 4:
        return {"t": "control", "id": r.randrange(9), "op": r.choice(["status", "nope"])}
    if kind == 5:
        data = orjson.dumps(_v1_request(r)) + b"\n"
        return {"t": "record", "data": data}
    return {"t": r.choice(["written", "oversize", "eof", "output_failed"]), "seq": _value(r)}


def _mutated(r: random.Random, frame: dict[str, Any]) -> dict[str, Any]:
    frame = dict(frame)
    for _ in range(r.randint(1, 3)):
        action = r.randrange(3)
        if action == 0 and frame:
            frame[r.choice(list(frame))] = _value(r)
        elif action == 1 and len(frame) > 1:
            del frame[r.choice([k for k in frame if k != "t"] or ["t"])]
        else:
            frame[r.choice(FIELDS)] = _value(r)
    return frame


def _random_frame(r: random.Random) -> dict[str, Any]:
    t = r.choice([*FRAME_TYPES, _text(r, 12)])
    frame: dict[str, Any] = {"t": t}
    for _ in range(r.randint(0, 6)):
        frame[r.choice([*FIELDS, _text(r, 8)])] = _value(r)
    return frame


def _hello(r: random.Random, home: Path, project: Path, role: str) -> dict[str, Any]:
    frame = hello(role, launch_of(context(home, project)), "fuzz", "0")  # type: ignore[arg-type]
    if r.random() < 0.2:
        frame = _mutated(r, frame)
    return frame


def _fault(r: random.Random, home: Path, project: Path) -> tuple[str, bytes]:
    """One injected fault: its kind and the bytes that carry it."""
    kind = r.choice(
        [
            "random_bytes",
            "huge_header",
            "truncated",
            "bad_msgpack",
            "not_a_map",
            "int_keys",
            "ext_type",
            "deep",
            "wide",
            "bit_flip",
            "random_frame",
            "random_frame",
            "mutated",
            "mutated",
            "valid",
        ]
    )
    if kind == "random_bytes":
        return kind, r.randbytes(r.randint(1, 2048))
    if kind == "huge_header":
        size = r.choice([MAX_FRAME_BYTES + 1, 2**31, 2**32 - 1])
        return kind, struct.pack(">I", size) + r.randbytes(r.randint(0, 64))
    if kind == "truncated":
        body = msgpack.packb(_safe(_valid_frame(r, home, project)), use_bin_type=True)
        return kind, struct.pack(">I", len(body)) + body[: r.randrange(len(body))]
    if kind == "bad_msgpack":
        body = b"\xc1" + r.randbytes(r.randint(0, 100))  # 0xc1 is never valid msgpack
        return kind, struct.pack(">I", len(body)) + body
    if kind == "not_a_map":
        body = msgpack.packb(r.choice([[1, 2], 7, "t", None, b"x"]), use_bin_type=True)
        return kind, struct.pack(">I", len(body)) + body
    if kind == "int_keys":
        body = msgpack.packb({1: "x", "t": "request"}, use_bin_type=True)
        return kind, struct.pack(">I", len(body)) + body
    if kind == "ext_type":
        body = msgpack.packb({"t": "request", "x": msgpack.ExtType(5, b"ab")}, use_bin_type=True)
        return kind, struct.pack(">I", len(body)) + body
    if kind == "deep":
        nested: Any = "x"
        for _ in range(r.choice([65, 100, 500])):
            nested = [nested]
        body = msgpack.packb({"t": "request", "message": nested}, use_bin_type=True)
        return kind, struct.pack(">I", len(body)) + body
    if kind == "wide":
        body = msgpack.packb({"t": "snapshot", "turn_ids": [None] * 70_000}, use_bin_type=True)
        return kind, struct.pack(">I", len(body)) + body
    if kind == "bit_flip":
        raw = bytearray(encode_frame(_safe(_valid_frame(r, home, project))))
        for _ in range(r.randint(1, 4)):
            raw[r.randrange(len(raw))] ^= 1 << r.randrange(8)
        return kind, bytes(raw)
    if kind == "random_frame":
        return kind, encode_frame(_safe(_random_frame(r)))
    if kind == "mutated":
        return kind, encode_frame(_safe(_mutated(r, _valid_frame(r, home, project))))
    return kind, encode_frame(_safe(_valid_frame(r, home, project)))


# -- v2 connections -------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: collections.Counter[str] = collections.Counter()
        self.answers: collections.Counter[str] = collections.Counter()
        self.bytes_sent = 0
        self.connections = 0

    def add(self, faults: list[str], sent: int, answers: list[str]) -> None:
        with self.lock:
            self.faults.update(faults)
            self.answers.update(answers)
            self.bytes_sent += sent
            self.connections += 1


def _one_connection(seed: str, sock_path: Path, home: Path, project: Path, tally: Tally) -> None:
    r = random.Random(seed)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    faults: list[str] = []
    answers: list[str] = []
    sent = 0
    try:
        sock.connect(str(sock_path))
        data = bytearray()
        opening = r.choice(["none", "persistent", "v1_shim", "control", "fuzzed"])
        if opening == "fuzzed":
            _, raw = _fault(r, home, project)
            data += raw
            faults.append("hello_fault")
        elif opening != "none":
            data += encode_frame(_safe(_hello(r, home, project, opening)))
        for _ in range(r.randint(1, 12)):
            kind, raw = _fault(r, home, project)
            data += raw
            faults.append(kind)
        view = memoryview(bytes(data))
        while view:  # in random chunks, so frames split at any byte
            step = r.randint(1, min(len(view), 8192))
            sock.sendall(view[:step])
            sent += step
            view = view[step:]
        answers = _read_answers(sock, idle=0.5)
    except (TimeoutError, ConnectionError, BrokenPipeError, OSError):
        pass
    finally:
        if r.random() < 0.3:  # a reset instead of an orderly close
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        tally.add(faults, sent, answers)


def _read_answers(sock: socket.socket, idle: float) -> list[str]:
    sock.settimeout(idle)
    decoder = FrameDecoder()
    seen: list[str] = []
    try:
        while chunk := sock.recv(65536):
            for frame in decoder.feed(chunk):
                t = frame.get("t")
                code = frame.get("code")
                seen.append(f"{t}:{code}" if code else str(t))
    except (TimeoutError, ConnectionError, OSError, FrameError):
        pass
    return seen


# -- v1 lines on the shim's stdin -------------------------------------------------------------


def _v1_line(r: random.Random) -> bytes:
    kind = r.randrange(12)
    if kind == 10:
        return r.choice(
            [
                b'{"protocol_version": 1e400, "kind": "request"}',
                b'{"protocol_version": 1, "request_id": "a", "request_id": "b"}',
                b'{"protocol_version": 123456789012345678901234567890}',
                b'{"a": "\\ud800"}',
                b"\x00\x00\x00",
                b"{" * 5,
            ]
        )
    if kind == 0:
        return r.randbytes(r.randint(0, 300)).replace(b"\n", b" ")
    if kind == 1:
        return b"\xff\xfe" + r.randbytes(20).replace(b"\n", b"")  # invalid UTF-8
    if kind == 2:
        return b"x" * r.choice([65_536, 70_000, 200_000])  # over the record bound
    if kind == 3:
        depth = r.choice([40, 1000, 20_000])
        return b"[" * depth + b"]" * depth
    if kind == 4:
        return orjson.dumps(r.choice([1, "s", None, [1], True]))
    if kind == 5:
        return b""
    if kind == 6:
        return orjson.dumps(_v1_request(r)) + b"\r"  # CRLF
    if kind == 7:
        record = _v1_request(r)
        record[r.choice(["protocol_version", "kind", "request_id", "payload", "extra"])] = _plain(r)
        return orjson.dumps(_safe({"message": record})["message"])
    if kind == 8:
        record = _v1_request(r)
        record["payload"] = {"blob": "y" * r.choice([16_000, 33_000])}
        return orjson.dumps(record)
    if kind == 9:
        line = bytearray(orjson.dumps(_v1_request(r)))
        for _ in range(r.randint(1, 3)):
            line[r.randrange(len(line))] = r.randrange(32, 256)
        return bytes(line).replace(b"\n", b" ")
    return orjson.dumps(_v1_request(r))


def _plain(r: random.Random) -> Any:
    """A JSON-encodable random value."""
    return r.choice([None, 2, -1, 2**64 - 1, "x", [], {}, {"a": [1, {"b": None}]}, 1.5, True])


async def _fuzz_shim(home: Path, project: Path, r: random.Random, lines: int) -> dict[str, Any]:
    svc = await ServiceProcess.start(home, project)
    assert svc.proc.stdout is not None
    out: list[dict[str, Any]] = []
    final = "final-status"

    async def reader() -> None:
        assert svc.proc.stdout is not None
        while line := await svc.proc.stdout.readline():
            assert line.endswith(b"\n"), line[-200:]
            message = orjson.loads(line)  # every stdout line is one JSON record
            out.append(message)
            if message.get("kind") == "response" and message.get("request_id") == final:
                return

    task = asyncio.create_task(reader())
    sent = 0
    try:
        init = envelope.request("init", "initialize", {"supported_protocol_versions": [1]})
        await svc.send(init)
        for _ in range(lines):
            data = _v1_line(r) + b"\n"
            sent += len(data)
            await svc.send_raw(data)
        await svc.send(envelope.request(final, "status", {}))
        await asyncio.wait_for(task, 60)
        await svc.close_stdin()
        assert svc.proc.stdout is not None
        await asyncio.wait_for(svc.proc.stdout.read(), 60)
        code = await svc.wait(60)
        stderr = await svc.stderr_text()
    finally:
        task.cancel()
        if svc.proc.returncode is None:
            svc.proc.kill()
            await svc.proc.wait()
    assert out[-1]["error"] is None, out[-1]
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    errors = collections.Counter(
        m["error"]["code"] for m in out if m.get("kind") == "response" and m.get("error")
    )
    return {"bytes": sent, "records_out": len(out), "errors": errors}


async def test_fuzzed_v2_frames_and_v1_lines_leave_the_daemon_healthy(
    home: Path, project: Path
) -> None:
    r = rng("fuzz")
    connections = scaled(120, 1200)
    shims = scaled(2, 6)
    lines = scaled(150, 1000)
    with FakeProviderServer() as fake:
        fake.set_default(Reply(text=["fuzz ", "answer"]))
        write_settings(home, fake)
        started = await asyncio.to_thread(cli, home, "daemon", "start", extra=FAST)
        assert started.returncode == 0, started.stderr
        pid = (await asyncio.to_thread(status, home))["pid"]
        before = proc_figures(pid)
        sock_path = socket_for(context(home, project))
        tally = Tally()
        seeds = [f"{r.random()}" for _ in range(connections)]

        def fuzz_all() -> None:
            with ThreadPoolExecutor(16) as pool:
                for seed in seeds:
                    pool.submit(_one_connection, seed, sock_path, home, project, tally)

        await asyncio.to_thread(fuzz_all)
        peak = proc_figures(pid)

        v1 = [await _fuzz_shim(home, project, r, lines) for _ in range(shims)]

        # Still the same daemon, answering, with every fuzzing client gone.
        await wait_until(
            lambda: status(home)["clients"] == 0, 60, "the fuzzing connections to be dropped"
        )
        info = await control_status(home, project)
        assert info["pid"] == pid
        assert info["clients"] == 0
        await wait_until(lambda: status(home)["active_turns"] == 0, 60, "fuzzed turns to end")
        after = proc_figures(pid)
        log = daemon_log(home)
        problems = tracebacks(log)
        v1_errors: collections.Counter[str] = collections.Counter()
        for result in v1:
            v1_errors.update(result["errors"])
        report(
            "fuzz",
            v2_connections=tally.connections,
            v2_faults=sum(tally.faults.values()),
            v2_bytes=tally.bytes_sent,
            v2_answers=sum(tally.answers.values()),
            v2_top_answers=dict(tally.answers.most_common(6)),
            v1_shims=shims,
            v1_lines=shims * lines,
            v1_bytes=sum(x["bytes"] for x in v1),
            v1_records_out=sum(x["records_out"] for x in v1),
            v1_top_errors=dict(v1_errors.most_common(5)),
            before=before,
            peak=peak,
            after=after,
            tracebacks=log.count("Traceback"),
            distinct_tracebacks=len(problems),
        )
        assert "Traceback" not in log, "\n".join(problems)


# -- the defects the fuzzer found, one deterministic frame each ----------------------------


def _exchange(home: Path, project: Path, data: bytes, then: bytes = b"") -> list[dict[str, Any]]:
    """Send ``data`` in one write (and ``then`` after the first answer); every answer
    until the daemon closes or goes quiet."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(socket_for(context(home, project))))
        sock.sendall(data)
        sock.settimeout(5)
        decoder = FrameDecoder()
        frames: list[dict[str, Any]] = []
        with contextlib.suppress(TimeoutError, ConnectionError):
            while chunk := sock.recv(65536):
                frames += decoder.feed(chunk)
                if then and frames:
                    sock.sendall(then)
                    then = b""
                    sock.settimeout(2)
        return frames
    finally:
        sock.close()


def _started(home: Path) -> None:
    started = cli(home, "daemon", "start")
    assert started.returncode == 0, started.stderr


def _codes(frames: list[dict[str, Any]]) -> list[tuple[object, object]]:
    return [(f.get("t"), f.get("code")) for f in frames]


@pytest.mark.parametrize("role", [["persistent"], {"role": "persistent"}])
def test_a_hello_whose_role_is_not_a_string_is_refused_as_invalid_hello(
    home: Path, project: Path, role: object
) -> None:
    _started(home)
    frame = dict(hello("persistent", launch_of(context(home, project)), "fuzz", "0"))
    frame["role"] = role
    frames = _exchange(home, project, encode_frame(frame))
    assert _codes(frames) == [("refused", "invalid_hello")]
    log = daemon_log(home)
    assert "Traceback" not in log, "\n".join(tracebacks(log))


@pytest.mark.parametrize("kind", [["request"], {"t": "request"}])
def test_a_frame_whose_type_is_not_a_string_is_an_unknown_frame(
    home: Path, project: Path, kind: object
) -> None:
    _started(home)
    opening = hello("persistent", launch_of(context(home, project)), "fuzz", "0")
    frames = _exchange(home, project, encode_frame(opening) + encode_frame({"t": kind}))
    assert _codes(frames) == [("welcome", None), ("error", "unknown_frame")]
    log = daemon_log(home)
    assert "Traceback" not in log, "\n".join(tracebacks(log))


@pytest.mark.parametrize("ack", [{"t": "written", "seq": 1}, {"t": "output_failed"}])
def test_a_v1_shim_acknowledgement_in_the_hellos_read_is_not_an_internal_error(
    home: Path, project: Path, ack: dict[str, Any]
) -> None:
    """Nothing is pending yet: the daemon must not fail its own handler over it.

    A stray ``written`` is ignored (the connection then works as usual); what a stray
    ``output_failed`` does is the daemon's choice, as long as it is not an internal error.
    """
    _started(home)
    opening = hello("v1_shim", launch_of(context(home, project)), "fuzz", "0")
    init = envelope.request("i1", "initialize", {"supported_protocol_versions": [1]})
    record = encode_frame({"t": "record", "data": orjson.dumps(init)})
    frames = _exchange(home, project, encode_frame(opening) + encode_frame(ack), then=record)
    assert ("error", "internal_error") not in _codes(frames), frames
    outputs = [f for f in frames if f.get("t") == "output"]
    if ack["t"] == "written":
        assert outputs and b'"request_id":"i1"' in outputs[0]["data"], frames
    log = daemon_log(home)
    assert "Traceback" not in log, "\n".join(tracebacks(log))
