"""The daemon's RSS as its conversations grow: the soak's memory question in two minutes.

One daemon, the loopback fake provider as its own process, four persistent clients. Each
client runs its turns one after another over a few sessions of its own, round robin, so
that every conversation grows by one turn at a time for the whole run: ``--sessions 4``
(one each) has every turn find its window in the daemon's cache; ``--sessions 16`` (the
default; four each) is more than the cache holds, so most turns parse their window
again, as in ``make soak``. The daemon's RSS is printed every ``--every`` turns, then the
slope per 1,000 turns after the first sample (a least-squares fit).

``--context-window N`` declares the fake model's window as N tokens: each conversation
then compacts when it reaches 80 % of it (the provider answers the summary request), so
what a turn reads and resends stops growing, as against a real model, whose window (128k
tokens or more) these short turns would take hours to fill. By default (0) the window is
the API's, which no conversation here reaches.

First, in this process, what a turn's start holds of a long session whose window is not
cached (~2 MiB of short turns, no checkpoint): the traced memory of its context (the
parsed window, which the store's cache keeps) and, on top of it, of its first request as
sent (the body's chunks, its messages among them; Anthropic's and the chat API's) and of
the window's projection for a replay (which the cache keeps too), held and at peak.

    .venv/bin/python benchmarks/bench_turn_memory.py [--quick] [--sessions N] [--turns N]
        [--every N] [--context-window N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from benchlib import (
    FakeProvider,
    add_context_window_argument,
    argument_parser,
    daemon_launch_context,
    daemon_process,
    daemon_workspace,
    figure,
    heading,
    run_with_daemons,
    slope_per_thousand,
    write_provider_settings,
    write_short_turns,
)

from magi_code.client import Client
from magi_code.providers import ApiKind, Endpoint, MessageCache, ProviderRequest, build_call
from magi_code.sessions.store import SessionStore
from magi_code.turns.context import items_from_records

CLIENTS = 4
REPLY = {"text": ["a reply of a few words, " * 4] * 3}
BUSY = ("configuration_busy", "session_busy")  # another turn's end is still settling


async def _connect(ctx: Any) -> Client:
    client = await Client.connect(ctx, client_name="bench_turn_memory")
    reply = await client.request("initialize", {"supported_protocol_versions": [1]})
    if reply["error"] is not None:
        raise RuntimeError(f"initialize failed: {reply['error']}")
    return client


async def _turn(client: Client, session_id: str | None) -> str:
    while True:
        started = await client.request(
            "turn.start", {"prompt": "soak reply please"}, session_id=session_id
        )
        if started["error"] is None:
            break
        if started["error"]["code"] not in BUSY:
            raise RuntimeError(f"turn.start failed: {started['error']}")
        await asyncio.sleep(0.01)
    async for event in client.events():
        if isinstance(event, dict) and event["event"] == "turn.terminal":
            return str(started["payload"]["session_id"])
    raise RuntimeError("the connection ended before the turn did")


def start_memory(history_bytes: int) -> None:
    """Traced memory of a turn's start on a session of ``history_bytes`` (see above)."""
    with tempfile.TemporaryDirectory() as directory:
        sessions = Path(directory)
        session_id = SessionStore(sessions).create()
        write_short_turns(sessions / session_id / "history.jsonl", history_bytes)
        tracemalloc.start()
        try:
            store = SessionStore(sessions)  # kept: its cache holds the window, as a daemon's
            context = store.load_context(session_id)
            held, peak = tracemalloc.get_traced_memory()
            figure(f"context of {history_bytes >> 10:,} KiB of history: held", held / 2**20, "MiB")
            figure("  at its peak", peak / 2**20, "MiB")
            items = items_from_records(context.records)
            api: ApiKind
            for api in ("anthropic", "openai-chat"):
                before = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                request = ProviderRequest(
                    "model", "system", items, (), "default", False, 4096, None, MessageCache()
                )
                content = build_call(Endpoint(api, "http://127.0.0.1:1"), request).content()
                held, peak = tracemalloc.get_traced_memory()
                figure(f"  its first {api} request as sent: held", (held - before) / 2**20, "MiB")
                figure("    at its peak", (peak - before) / 2**20, "MiB")
                del content, request
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            store.replay(session_id, None, 16)  # the cached window, projected
            held, peak = tracemalloc.get_traced_memory()
            figure("  a replay's projection of it: held", (held - before) / 2**20, "MiB")
            figure("    at its peak", (peak - before) / 2**20, "MiB")
        finally:
            tracemalloc.stop()


async def main(args: argparse.Namespace) -> None:
    heading("bench_turn_memory: the daemon's RSS as its conversations grow", args.quick)
    start_memory((64 if args.quick else 2000) * 1024)
    turns = 40 if args.quick else args.turns
    every = 20 if args.quick else args.every
    per_client = max(1, args.sessions // CLIENTS)
    window = f", a {args.context_window:,}-token context" if args.context_window else ""
    print(
        f"   {CLIENTS} clients, {per_client * CLIENTS} sessions, {turns} turns each client{window}"
    )
    print(f"   {'turns':>7} {'rss_mib':>8}")
    async with FakeProvider.running() as fake:
        if args.context_window:
            await fake.answer_summaries()  # (its request quotes the prompts: routed first)
        await fake.route("soak reply please", REPLY)
        with daemon_workspace() as ws:
            write_provider_settings(ws.home, fake.base_url, args.context_window)
            ctx = daemon_launch_context(ws)
            clients = [await _connect(ctx) for _ in range(CLIENTS)]
            daemon = daemon_process(ws)
            points: list[tuple[int, float]] = []
            done = 0

            async def run(client: Client) -> None:
                nonlocal done
                sessions: list[str | None] = [None] * per_client
                for n in range(turns):
                    sessions[n % per_client] = await _turn(client, sessions[n % per_client])
                    done += 1
                    if done % every == 0:
                        rss = daemon.memory_info().rss / 2**20
                        points.append((done, rss))
                        print(f"   {done:>7} {rss:>8.1f}", flush=True)

            try:
                await asyncio.gather(*(run(client) for client in clients))
            finally:
                for client in clients:
                    await client.close()
    first, last = points[0], points[-1]
    print(f"   RSS {first[1]:.1f} -> {last[1]:.1f} MiB over turns {first[0]}-{last[0]}")
    fit = slope_per_thousand([turns for turns, _ in points], [rss for _, rss in points])
    print(f"   slope: {fit:+.3f} MiB per 1,000 turns", flush=True)


if __name__ == "__main__":
    parser = argument_parser(__doc__ or "")
    parser.add_argument("--sessions", type=int, default=16, help="sessions in all (4+)")
    parser.add_argument("--turns", type=int, default=900, help="turns per client")
    parser.add_argument("--every", type=int, default=400, help="turns between samples")
    add_context_window_argument(parser)
    run_with_daemons(main, __doc__ or "", parser.parse_args())
