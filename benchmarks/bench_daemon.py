"""The per-user daemon: shim vs embedded, start-up, memory, v2 turns (issue 5).

Figures: sequential ``status`` round trip (median, p99) and pipelined throughput through
``magi-code --app service`` with ``MC_SERVICE_MODE=daemon`` (a shim bridged to a warm
daemon) beside ``embedded`` (after the fresh home's racy window, as in
``bench_protocol.py``); spawn -> first ``initialize`` response with no daemon
running (the shim starts it: cold) and with one already running (warm); the daemon's RSS
idle and with N persistent ``magi_code.client`` connections; and aggregate
``turn.assistant_delta`` throughput of 16 concurrent turns, one per persistent v2
connection, against the loopback fake provider.

Every daemon runs for a temporary MC_HOME and is stopped (``magi-code daemon stop``, then
killed if it is still there) when the script ends, also on errors and SIGTERM.

    .venv/bin/python benchmarks/bench_daemon.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping

import psutil
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    FakeProvider,
    ServiceProcess,
    Workspace,
    daemon_command,
    daemon_launch_context,
    daemon_process,
    daemon_workspace,
    figure,
    heading,
    median,
    percentile,
    pipelined_status_rate,
    rss_bytes,
    run_with_daemons,
    running_service,
    settle,
    workspace,
    write_provider_settings,
)

from magi_code.client import Client, Overloaded
from magi_code.core.turns import MAX_ACTIVE_TURNS
from magi_code.daemon.heap import TRIM_INTERVAL_SECONDS
from magi_code.protocol.limits import MAX_STRING_BYTES

MIB = 2**20
STEP_TIMEOUT = 60.0
# A turn's whole text is bounded by max_string_bytes, so one turn streams at most that
# many one-byte deltas (same size as bench_turns' long turn).
TURN_DELTAS = MAX_STRING_BYTES - 384
# -- status over stdio, both modes ----------------------------------------------------------


async def status_figures(service: ServiceProcess, warmup: int, count: int, piped: int) -> None:
    for _ in range(warmup):
        await service.request("status")
    samples: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        response = await service.request("status")
        samples.append(time.perf_counter() - start)
        if response["error"] is not None:
            raise RuntimeError(f"status failed: {response['error']}")
    mode = service.mode
    figure(f"status round trip, median ({mode})", median(samples) * 1e3, "ms")
    figure(f"status round trip, p99 ({mode})", percentile(samples, 99) * 1e3, "ms")
    figure(
        f"sequential status rate ({mode})",
        count / sum(samples),
        "req/s",
        "codex app-server ~7,200 req/s",
    )
    figure(
        f"pipelined status throughput, {piped:,} in flight ({mode})",
        await pipelined_status_rate(service, piped),
        "req/s",
        "codex app-server ~17,000 req/s",
    )


async def spawn_to_initialize(ws: Workspace, env: Mapping[str, str]) -> tuple[float, float]:
    """Seconds from process creation to the first ``initialize`` response, and from then
    closing stdin to the process's exit; the process is stopped afterwards (in daemon
    mode the last shim of ``ws`` also stops the daemon)."""
    start = time.perf_counter()
    async with running_service(ws, env, initialize=False) as service:
        await service.initialize()
        elapsed = time.perf_counter() - start
        if service.mode == "daemon":
            daemon_process(ws)
        closed = time.perf_counter()
        await service.close_stdin()
        code = await service.wait(STEP_TIMEOUT)
        exited = time.perf_counter() - closed
    if code != 0:
        raise RuntimeError(f"the service exited {code} at EOF")
    return elapsed, exited


# -- persistent v2 clients ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def persistent_clients(ws: Workspace, count: int) -> AsyncIterator[list[Client]]:
    """``count`` initialized persistent connections to the running daemon, closed on exit."""
    ctx = daemon_launch_context(ws)
    clients: list[Client] = []
    try:
        for _ in range(count):
            client = await Client.connect(ctx, autostart=False, client_name="bench")
            clients.append(client)
            response = await asyncio.wait_for(
                client.request("initialize", {"supported_protocol_versions": [1]}), STEP_TIMEOUT
            )
            if response["error"] is not None:
                raise RuntimeError(f"initialize failed: {response['error']}")
        yield clients
    finally:
        for client in clients:
            await client.close()


async def settled_rss(proc: psutil.Process, wait: float) -> float:
    await asyncio.sleep(wait)
    return rss_bytes(proc.pid) / MIB


async def clients_rss(ws: Workspace, daemon: psutil.Process, count: int, wait: float) -> None:
    idle = await settled_rss(daemon, wait)
    figure("daemon RSS idle (started, no clients)", idle, "MiB", "codex app-server ~89 MiB")
    async with persistent_clients(ws, count):
        loaded = await settled_rss(daemon, wait)
        async with await Client.connect(
            daemon_launch_context(ws), "control", autostart=False
        ) as ctl:
            seen = (await ctl.control("status")).get("clients")
    if not isinstance(seen, int) or seen < count:
        raise RuntimeError(f"the daemon reports {seen} clients, expected at least {count}")
    figure(f"daemon RSS with {count} persistent clients", loaded, "MiB")
    figure("  per connected client", (loaded - idle) * 1024 / count, "KiB")


async def one_turn(client: Client, started: list[float]) -> int:
    """Start a turn on ``client``; its assistant delta count once its terminal arrives."""
    events = client.events()
    started.append(time.perf_counter())
    for attempt in range(1000):
        request_id = f"turn-{id(client)}-{attempt}"
        response = await client.request(
            "turn.start", {"prompt": "Say something.", "options": {}}, request_id=request_id
        )
        # Starts whose settings captures overlap are refused busy (RFC-0002 §6.6): retry.
        error = response["error"]
        if error is None or error["code"] != "configuration_busy":
            break
    if response["error"] is not None:
        raise RuntimeError(f"turn.start failed: {response['error']}")
    deltas = 0
    async for event in events:
        if isinstance(event, Overloaded):
            raise RuntimeError(f"the daemon cut the client from turn {event.turn_id}")
        if event.get("request_id") != request_id:
            continue
        if event["event"] == "turn.assistant_delta":
            deltas += 1
        elif event["event"] == "turn.terminal":
            if event["payload"]["status"] != "completed":
                raise RuntimeError(f"turn ended {event['payload']['status']}")
            return deltas
    raise RuntimeError("connection closed before the turn's terminal")


async def concurrent_turns(
    ws: Workspace, daemon: psutil.Process, fake: FakeProvider, deltas: int
) -> None:
    turns = MAX_ACTIVE_TURNS
    peak = rss_bytes(daemon.pid)
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(psutil.Error):
                peak = max(peak, rss_bytes(daemon.pid))
            await asyncio.sleep(0.005)

    async with persistent_clients(ws, turns) as clients:
        await fake.enqueue(*({"kind": "fast", "count": deltas} for _ in range(turns)))
        sampler = asyncio.create_task(sample())
        started: list[float] = []
        try:
            async with asyncio.timeout(STEP_TIMEOUT * 4):
                counts = await asyncio.gather(*(one_turn(client, started) for client in clients))
            elapsed = time.perf_counter() - min(started)
        finally:
            stop.set()
            await sampler
    if sum(counts) != turns * deltas:
        raise RuntimeError(f"expected {turns * deltas} deltas, got {sum(counts)}")
    figure(
        f"aggregate deltas/s, {turns} turns x {deltas:,} over v2", sum(counts) / elapsed, "deltas/s"
    )
    figure(f"daemon RSS peak during those {turns} turns", peak / MIB, "MiB")


# -- phases ---------------------------------------------------------------------------------


async def embedded_phase(args: argparse.Namespace) -> list[tuple[float, float]]:
    """Embedded figures; returns the spawn -> initialize / EOF -> exit samples."""
    with workspace() as ws:
        async with running_service(ws, EMBEDDED_ENV) as service:
            await settle(service, args.quick)
            await status_figures(service, *counts(args))
        return [await spawn_to_initialize(ws, EMBEDDED_ENV) for _ in range(spawns(args))]


def start_and_exit_figures(kind: str, samples: list[tuple[float, float]], reference: bool) -> None:
    n = len(samples)
    figure(
        f"spawn -> initialize, {kind}, median of {n}",
        median([start for start, _ in samples]) * 1e3,
        "ms",
        "codex app-server ~56 ms" if reference else None,
    )
    figure(f"EOF -> exit, {kind}, median of {n}", median([end for _, end in samples]) * 1e3, "ms")


async def daemon_phase(args: argparse.Namespace, embedded: list[tuple[float, float]]) -> None:
    async with FakeProvider.running() as fake:
        with daemon_workspace() as ws:
            write_provider_settings(ws.home, fake.base_url)
            # Cold: each shim finds no daemon and starts one; stopping the shim (the last
            # one of this MC_HOME) runs `daemon stop`, so the next spawn is cold again.
            cold = [await spawn_to_initialize(ws, DAEMON_ENV) for _ in range(spawns(args))]

            await daemon_command(ws, "start")
            daemon = daemon_process(ws)
            # RSS is read 0.5 s after a change (at once in a quick run).
            await clients_rss(ws, daemon, 4 if args.quick else 100, 0 if args.quick else 0.5)
            await concurrent_turns(ws, daemon, fake, 20 if args.quick else TURN_DELTAS)
            # Long enough for the daemon to give back the heap those turns freed.
            after = await settled_rss(daemon, 0 if args.quick else TRIM_INTERVAL_SECONDS + 1)

            # A long-lived shim keeps the daemon warm: the measured shims are never the
            # last one of this MC_HOME, so stopping them leaves the daemon running.
            async with running_service(ws, DAEMON_ENV) as keeper:
                warm = [await spawn_to_initialize(ws, DAEMON_ENV) for _ in range(spawns(args))]
                await status_figures(keeper, *counts(args))
    start_and_exit_figures("embedded", embedded, reference=False)
    start_and_exit_figures("shim, cold daemon", cold, reference=True)
    start_and_exit_figures("shim, warm daemon", warm, reference=True)
    figure("daemon RSS after that work, no clients", after, "MiB")


def counts(args: argparse.Namespace) -> tuple[int, int, int]:
    """(warm-up, sequential, pipelined) status request counts."""
    return (10, 50, 100) if args.quick else (300, 2000, 10000)


def spawns(args: argparse.Namespace) -> int:
    return 1 if args.quick else 8


async def main(args: argparse.Namespace) -> None:
    heading("bench_daemon: shim and daemon vs embedded", args.quick)
    embedded = await embedded_phase(args)
    await daemon_phase(args, embedded)


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "")
