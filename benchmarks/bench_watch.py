"""Watch fan-out (RFC-0002 §6.9): one turn watched by 1, 8 and 32 persistent connections.

A persistent client starts a turn whose reply streams in paced deltas (the fake provider
sends one text chunk every few milliseconds; no delta coalescing); the other connections
``session.watch`` the session. Every connection lives in this process and timestamps each
``turn.assistant_delta`` as it takes it from its client (one clock, this process's). A
delta's lag at a watcher is its receipt there minus the earliest receipt of the same
delta (by sequence) at any connection of the run, the turn's starter included: what the
fan-out adds behind the daemon's first send of it. Every connection is read by this
process's one event loop, so a lag also holds this process's handling of the frames of
the connections read before it. Printed: p50 and p99 over every (watcher, delta), and
the starter's own lag the same way.

    .venv/bin/python benchmarks/bench_watch.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchlib import (
    FakeProvider,
    daemon_launch_context,
    daemon_workspace,
    heading,
    percentile,
    run_with_daemons,
    write_provider_settings,
)

from magi_code.client import Client, Watched

WATCHERS = (1, 8, 32)
CHUNK_DELAY = 0.005
STEP_TIMEOUT = 120.0


async def _connect(ctx: Any, name: str) -> Client:
    client = await Client.connect(ctx, client_name=name)
    reply = await client.request("initialize", {"supported_protocol_versions": [1]})
    if reply["error"] is not None:
        raise RuntimeError(f"initialize failed: {reply['error']}")
    return client


async def _receipts(client: Client, watching: bool) -> dict[int, float]:
    """sequence -> when this connection took that delta, until the turn's terminal."""
    seen: dict[int, float] = {}
    async for item in client.events():
        now = time.perf_counter()
        event = item.event if isinstance(item, Watched) else item
        if not isinstance(event, dict) or (isinstance(item, Watched) != watching):
            continue
        if event["event"] == "turn.assistant_delta":
            seen[event["payload"]["sequence"]] = now
        elif event["event"] == "turn.terminal":
            return seen
    raise RuntimeError("the connection ended before the turn did")


async def one_turn(fake: FakeProvider, watchers: int, deltas: int) -> tuple[list[float], ...]:
    with daemon_workspace() as ws:
        write_provider_settings(ws.home, fake.base_url)
        ctx = daemon_launch_context(ws)
        starter = await _connect(ctx, "starter")
        clients = [starter]
        try:
            created = await starter.request("session.create", {})
            session_id = created["payload"]["session_id"]
            for _ in range(watchers):
                watcher = await _connect(ctx, "watcher")
                clients.append(watcher)
                await watcher.watch(session_id)
            tasks = [asyncio.create_task(_receipts(starter, False))]
            tasks += [asyncio.create_task(_receipts(w, True)) for w in clients[1:]]
            text = [f"d{i} " for i in range(deltas)]
            await fake.enqueue({"text": text, "chunk_delay": CHUNK_DELAY})
            reply = await starter.request("turn.start", {"prompt": "go"}, session_id=session_id)
            if reply["error"] is not None:
                raise RuntimeError(f"turn.start failed: {reply['error']}")
            seen = await asyncio.wait_for(asyncio.gather(*tasks), STEP_TIMEOUT)
        finally:
            for client in clients:
                await client.close()
    sequences = set(seen[0])
    if any(set(s) != sequences for s in seen) or not sequences:
        raise RuntimeError("a connection missed deltas")
    first = {seq: min(s[seq] for s in seen) for seq in sequences}
    starter_lags = [seen[0][seq] - first[seq] for seq in sequences]
    watcher_lags = [s[seq] - first[seq] for s in seen[1:] for seq in sequences]
    return watcher_lags, starter_lags


async def main(args: argparse.Namespace) -> None:
    heading("bench_watch: one turn watched by 1, 8 and 32 connections", args.quick)
    deltas = 5 if args.quick else 200
    runs = 1 if args.quick else 3
    print(f"   {deltas} paced deltas a turn, {runs} turn(s) per row; lag in ms")
    print(f"   {'watchers':>8} {'deltas seen':>12} {'p50':>8} {'p99':>8}   starter p50/p99")
    async with FakeProvider.running() as fake:
        for count in WATCHERS:
            lags: list[float] = []
            own: list[float] = []
            for _ in range(runs):
                watcher_lags, starter_lags = await one_turn(fake, count, deltas)
                lags += watcher_lags
                own += starter_lags
            p50, p99 = percentile(lags, 50) * 1e3, percentile(lags, 99) * 1e3
            mine = f"{percentile(own, 50) * 1e3:.2f}/{percentile(own, 99) * 1e3:.2f}"
            print(f"   {count:>8} {len(lags):>12} {p50:>8.2f} {p99:>8.2f}   {mine}", flush=True)


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "")
