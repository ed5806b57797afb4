"""Streamed turns through the real stdio process, against a loopback provider (issue 4).

Figures: the service's added latency from writing ``turn.start`` to the first
``turn.assistant_delta`` (the fake provider's own time to first delta, measured with a
direct httpx stream, is subtracted); sustained ``turn.assistant_delta`` events/s for one
long turn; and the RSS of the service process idle and at peak during 16 concurrent turns.

    .venv/bin/python benchmarks/bench_turns.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

from benchlib import (
    FakeProvider,
    ServiceProcess,
    figure,
    heading,
    median,
    rss_bytes,
    run,
    running_service,
    workspace,
    write_provider_settings,
)

from magi_code.core.turns import MAX_ACTIVE_TURNS
from magi_code.protocol.limits import MAX_STRING_BYTES

# The whole assistant text of one turn is bounded by max_string_bytes (the terminal carries
# it as one string), so one turn can stream at most that many one-byte deltas.
LONG_TURN_DELTAS = MAX_STRING_BYTES - 384
MIB = 2**20


def turn_record(service: ServiceProcess, session_id: str | None) -> tuple[str, dict[str, Any]]:
    request_id = service.next_id("turn")
    record: dict[str, Any] = {
        "protocol_version": 1,
        "kind": "request",
        "request_id": request_id,
        "method": "turn.start",
        "payload": {"prompt": "Say something.", "options": {}},
    }
    if session_id is not None:
        record["session_id"] = session_id
    return request_id, record


async def until_terminal(service: ServiceProcess, request_ids: set[str]) -> dict[str, int]:
    """Read everything up to the terminal of every request; deltas counted per request."""
    deltas = dict.fromkeys(request_ids, 0)
    open_ids = set(request_ids)
    while open_ids:
        message = await service.recv()
        if message["kind"] == "response":
            if message["error"] is not None:
                raise RuntimeError(f"turn.start failed: {message['error']}")
            continue
        request_id = message["request_id"]
        if message["event"] == "turn.assistant_delta":
            deltas[request_id] += 1
        elif message["event"] == "turn.terminal":
            status = message["payload"]["status"]
            if status != "completed":
                raise RuntimeError(f"turn ended {status}")
            open_ids.discard(request_id)
    return deltas


async def provider_first_delta(fake: FakeProvider, turns: int) -> float:
    """Median time from sending a streaming request to the fake's first content chunk."""
    body = {
        "model": "m1",
        "stream": True,
        "messages": [{"role": "user", "content": "Say something."}],
    }
    samples: list[float] = []
    for _ in range(turns):
        await fake.enqueue({"kind": "fast", "count": 50})
        start = time.perf_counter()
        async with fake.client.stream("POST", "/v1/chat/completions", json=body) as response:
            first: float | None = None
            async for chunk in response.aiter_raw():
                if first is None and b'"content"' in chunk:
                    first = time.perf_counter() - start
        if first is None:
            raise RuntimeError("fake provider sent no content")
        samples.append(first)
    return median(samples)


async def first_delta_latency(service: ServiceProcess, fake: FakeProvider, turns: int) -> None:
    created = await service.request("session.create")
    session_id = created["payload"]["session_id"]
    to_accept: list[float] = []
    to_delta: list[float] = []
    for _ in range(turns):
        await fake.enqueue({"kind": "fast", "count": 50})
        request_id, record = turn_record(service, session_id)
        start = time.perf_counter()
        await service.send(record)
        first_delta = None
        while True:
            message = await service.recv()
            if message["request_id"] != request_id:
                raise RuntimeError(f"unexpected message: {message}")
            if message["kind"] == "response":
                to_accept.append(time.perf_counter() - start)
                if message["error"] is not None:
                    raise RuntimeError(f"turn.start failed: {message['error']}")
            elif message["event"] == "turn.assistant_delta" and first_delta is None:
                first_delta = time.perf_counter() - start
            elif message["event"] == "turn.terminal":
                break
        if first_delta is None:
            raise RuntimeError("turn produced no delta")
        to_delta.append(first_delta)
    await service.request("session.close", session_id=session_id)
    provider = await provider_first_delta(fake, turns)
    through_service = median(to_delta)
    figure(f"turn.start -> response, median of {turns}", median(to_accept) * 1e3, "ms")
    figure("turn.start -> first assistant delta, median", through_service * 1e3, "ms")
    figure("  fake provider alone: request -> first delta", provider * 1e3, "ms")
    figure(
        "service-added latency to first delta",
        (through_service - provider) * 1e3,
        "ms",
        "codex app-server ~31 ms",
    )


async def sustained_deltas(
    service: ServiceProcess, fake: FakeProvider, turns: int, deltas: int
) -> None:
    rates: list[float] = []
    for _ in range(turns):
        await fake.enqueue({"kind": "fast", "count": deltas})
        request_id, record = turn_record(service, None)
        await service.send(record)
        first = None
        count = 0
        while True:
            message = await service.recv()
            if message["request_id"] != request_id:
                raise RuntimeError(f"unexpected message: {message}")
            if message["kind"] == "response":
                continue
            if message["event"] == "turn.assistant_delta":
                count += 1
                if first is None:
                    first = time.perf_counter()
            elif message["event"] == "turn.terminal":
                done = time.perf_counter()
                break
        if first is None or count != deltas:
            raise RuntimeError(f"expected {deltas} deltas, got {count}")
        rates.append((count - 1) / (done - first))
    figure(f"sustained deltas, one turn of {deltas:,}", median(rates), "deltas/s")


async def concurrent_rss(
    service: ServiceProcess, fake: FakeProvider, deltas: int, settle: float
) -> None:
    await asyncio.sleep(settle)
    idle = rss_bytes(service.proc.pid)
    figure("service RSS idle (after initialize)", idle / MIB, "MiB", "codex app-server ~89 MiB")
    peak = idle
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(Exception):
                peak = max(peak, rss_bytes(service.proc.pid))
            await asyncio.sleep(0.005)

    await fake.enqueue(*({"kind": "fast", "count": deltas} for _ in range(MAX_ACTIVE_TURNS)))
    sampler = asyncio.create_task(sample())
    try:
        ids = []
        start = time.perf_counter()
        for _ in range(MAX_ACTIVE_TURNS):
            request_id, record = turn_record(service, None)
            ids.append(request_id)
            await service.send(record)
        counts = await until_terminal(service, set(ids))
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        await sampler
    figure(f"service RSS peak, {MAX_ACTIVE_TURNS} concurrent turns", peak / MIB, "MiB")
    figure("  aggregate deltas/s across those turns", sum(counts.values()) / elapsed, "deltas/s")
    figure("service RSS afterwards", rss_bytes(service.proc.pid) / MIB, "MiB")


async def main(args: argparse.Namespace) -> None:
    heading("bench_turns: streamed turns against a loopback provider", args.quick)
    async with FakeProvider.running() as fake:
        with workspace() as ws:
            write_provider_settings(ws.home, fake.base_url)
            async with running_service(ws) as service:
                # Idle RSS is read 0.5 s after initialize (at once in a quick run).
                deltas, settle = (20, 0.0) if args.quick else (4000, 0.5)
                await concurrent_rss(service, fake, deltas, settle)
                await first_delta_latency(service, fake, 1 if args.quick else 20)
                if args.quick:
                    await sustained_deltas(service, fake, 1, 100)
                else:
                    await sustained_deltas(service, fake, 3, LONG_TURN_DELTAS)


if __name__ == "__main__":
    run(main, __doc__ or "")
