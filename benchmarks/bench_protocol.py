"""Protocol overhead through the real stdio process (issue 2).

Figures: sequential ``status`` round-trip latency (median, p99) and rate; pipelined
``status`` throughput; sequential ``capabilities`` and ``session.list`` rates (the other
cheap requests); the sequential ``status`` rate while a settings file has just changed
(re-read on every request); process spawn -> first ``initialize`` response; and the
in-process cost of decoding/validating a maximum-size request record (``decode_record``).

``status`` is measured in its steady state: the service re-reads settings and the auth
store while anything it stamps changed less than ``RACY_WINDOW_NS`` (2 s) ago, and its
first start writes ``settings.schema.json`` into the fresh home, so the script waits
that window out once before measuring (not with ``--quick``).

    .venv/bin/python benchmarks/bench_protocol.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from benchlib import (
    ServiceProcess,
    figure,
    heading,
    median,
    percentile,
    pipelined_status_rate,
    run,
    running_service,
    settle,
    workspace,
)

from magi_code.protocol.envelope import Rejected, decode_record
from magi_code.protocol.limits import (
    MAX_ARRAY_ITEMS,
    MAX_OBJECT_FIELDS,
    MAX_PAYLOAD_BYTES,
    MAX_RECORD_BYTES,
    MAX_STRING_BYTES,
)
from magi_code.storage.stamps import RACY_WINDOW_NS


async def sequential(service: ServiceProcess, warmup: int, count: int) -> None:
    for _ in range(warmup):
        await service.request("status")
    samples: list[float] = []
    began = time.perf_counter()
    for _ in range(count):
        start = time.perf_counter()
        response = await service.request("status")
        samples.append(time.perf_counter() - start)
        if response["error"] is not None:
            raise RuntimeError(f"status failed: {response['error']}")
    total = time.perf_counter() - began
    figure("status round trip, median", median(samples) * 1e3, "ms")
    figure("status round trip, p99", percentile(samples, 99) * 1e3, "ms")
    figure("sequential status rate", count / total, "req/s", "codex app-server ~7,200 req/s")


async def cheap_requests(service: ServiceProcess, warmup: int, count: int) -> None:
    """Sequential rates of the other cheap requests (``session.list`` of an empty home)."""
    for method in ("capabilities", "session.list"):
        for _ in range(warmup):
            await service.request(method)
        began = time.perf_counter()
        for _ in range(count):
            response = await service.request(method)
            if response["error"] is not None:
                raise RuntimeError(f"{method} failed: {response['error']}")
        figure(f"sequential {method} rate", count / (time.perf_counter() - began), "req/s")


async def rereading(service: ServiceProcess, settings: Path, count: int) -> None:
    """``status`` while a settings file changed less than the racy window ago."""
    settings.write_text("{}")
    began = time.perf_counter()
    for _ in range(count):
        await service.request("status")
    elapsed = time.perf_counter() - began
    if elapsed * 1e9 >= RACY_WINDOW_NS:
        raise RuntimeError("the re-read figure ran past the racy window")
    figure("sequential status rate, settings just changed", count / elapsed, "req/s")


async def pipelined(service: ServiceProcess, count: int) -> None:
    figure(
        f"pipelined status throughput ({count:,} in flight)",
        await pipelined_status_rate(service, count),
        "req/s",
        "codex app-server ~17,000 req/s",
    )


async def spawn_to_initialize(spawns: int) -> None:
    samples: list[float] = []
    floor: list[float] = []
    with workspace() as ws:
        for _ in range(spawns):
            start = time.perf_counter()
            async with running_service(ws, initialize=False) as service:
                await service.initialize()
                samples.append(time.perf_counter() - start)
        # The interpreter alone, for scale: what any Python service pays before import.
        for _ in range(spawns):
            start = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
            await proc.wait()
            floor.append(time.perf_counter() - start)
    figure(
        f"spawn -> initialize response, median of {spawns}",
        median(samples) * 1e3,
        "ms",
        "codex app-server ~56 ms",
    )
    figure("  for scale: bare `python -c pass`, median", median(floor) * 1e3, "ms")


def _pad_to_record_limit(record: dict[str, Any], text_fields: list[tuple[str, str]]) -> bytes:
    """Encode ``record`` as one line of exactly ``MAX_RECORD_BYTES - 1`` bytes (the newline
    makes the limit) without changing the decoded payload: ASCII characters are spelled
    as six-byte ``\\u00XX`` escapes until the line is long enough, then spaces fill up."""
    line = orjson.dumps(record)
    target = MAX_RECORD_BYTES - 1
    for key, value in text_fields:
        if len(line) >= target:
            break
        old = orjson.dumps(value)
        escapes = min(len(value), (target - len(line)) // 5)
        spelled = "".join(f"\\u{ord(c):04x}" for c in value[:escapes])
        new = b'"' + spelled.encode() + old[1 + escapes :]
        line = line.replace(b'"' + key.encode() + b'":' + old, b'"' + key.encode() + b'":' + new)
    line = line[:-1] + b" " * (target - len(line)) + b"}"
    assert len(line) == target, len(line)
    return line


def max_records() -> dict[str, bytes]:
    """Two worst cases at the record limit with payloads just under every limit."""
    envelope = {"protocol_version": 1, "kind": "request", "request_id": "r" * 128}
    envelope["method"] = "turn.start"
    # Long strings: two near-16 KiB strings whose compact payload is just under 32 KiB.
    chunk = MAX_PAYLOAD_BYTES // 2 - 16
    strings = {"a": "a" * min(chunk, MAX_STRING_BYTES), "b": "b" * min(chunk, MAX_STRING_BYTES)}
    # Wide: as many small containers as the payload budget allows (each one is walked),
    # four 64-item rows per field.
    row = list(range(MAX_ARRAY_ITEMS))
    rows = (MAX_PAYLOAD_BYTES - 512) // (len(orjson.dumps(row)) + 1)
    wide = {f"k{i}": [row] * min(4, rows - 4 * i) for i in range(-(-rows // 4))}
    assert len(wide) <= MAX_OBJECT_FIELDS
    records = {}
    for name, payload in (("long strings", strings), ("wide structure", wide)):
        assert len(orjson.dumps(payload)) <= MAX_PAYLOAD_BYTES
        texts = [(k, v) for k, v in payload.items() if isinstance(v, str)]
        records[name] = _pad_to_record_limit({**envelope, "payload": payload}, texts)
    return records


def decode_cost(iterations: int) -> None:
    for name, line in max_records().items():
        result = decode_record(line, lambda _rid: False)
        if isinstance(result, Rejected):
            raise RuntimeError(f"benchmark record rejected: {result.code}")
        loops = []
        parse_only = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(iterations):
                decode_record(line, lambda _rid: False)
            loops.append((time.perf_counter() - start) / iterations)
            start = time.perf_counter()
            for _ in range(iterations):
                orjson.loads(line)
            parse_only.append((time.perf_counter() - start) / iterations)
        figure(f"decode_record, {len(line) + 1:,}-byte record, {name}", min(loops) * 1e6, "us")
        figure("  orjson.loads alone, same record", min(parse_only) * 1e6, "us")


async def main(args: argparse.Namespace) -> None:
    heading("bench_protocol: stdio request/response overhead", args.quick)
    with workspace() as ws:
        async with running_service(ws) as service:
            await settle(service, args.quick)
            await sequential(service, 10 if args.quick else 300, 50 if args.quick else 2000)
            await pipelined(service, 100 if args.quick else 10000)
            await cheap_requests(service, 5 if args.quick else 100, 20 if args.quick else 1000)
            await rereading(service, ws.home / "settings.json", 20 if args.quick else 300)
    await spawn_to_initialize(1 if args.quick else 10)
    decode_cost(5 if args.quick else 300)


if __name__ == "__main__":
    run(main, __doc__ or "")
