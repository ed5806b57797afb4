"""Soak: one daemon under a mixed load for minutes, its health sampled over time.

Four frontends each spawn a shim (``magi-code --app service``, daemon mode) in a loop,
run a few turns on one of 50 sessions and exit; the turns are plain replies, shell,
``grep`` and MCP (``mcp-server-time``) tool calls, cancels (while streaming and while a
tool runs) and shims whose stdin closes mid-turn. A persistent v2 client takes turn
snapshots meanwhile, and every ``--interval`` seconds reads the daemon's health
(``status``: RSS, descriptors, threads, children by kind, zombies) and its USS (psutil).
Each row of the table is one sample: the figures then, the first-delta latency p50/p95
and the turn outcomes since the previous row. The slope per 1,000 turns of each figure
is fitted over the samples after the first 1,000 turns (over the whole run when it is
shorter, which is then said), and the RSS's also over the last half of those samples:
what leaks grows in both, what fills a bound (the conversations growing to their
window, below) only in the first.

The run stops after ``--minutes`` or ``--turns`` started turns, whichever comes first;
every process is stopped and the temporary MC_HOME removed afterwards.

    .venv/bin/python benchmarks/soak.py [--minutes 5] [--turns 5000] [--interval 30]
    make soak MINUTES=60 TURNS=100000

``--tracemalloc FRAMES`` starts the daemon with ``MC_DAEMON_TRACEMALLOC=FRAMES`` and
signals it (``SIGUSR2``) at every sample, so that it writes where its Python heap grew
(``daemon/allocations.py``); the reports are copied to ``--tracemalloc-dir`` (default
``soak-tracemalloc/``) before the temporary MC_HOME goes. Each of these samples is taken
idle, so that a report shows what the daemon keeps, not the turns in flight.

``--idle-samples`` takes every sample idle: the frontends start no turn until the daemon
has none running and has been quiet for ``IDLE_SECONDS`` (so it has collected and
trimmed). The figures are then what the daemon holds between turns; by default they are
taken under load, in-flight turns included.

``--session-turns N`` bounds how long a session gets: after N turns on a session the
next turn in its slot starts a fresh one, so the conversations a turn resends (and the
daemon's working set with them) stop growing. By default (0) sessions only get longer.

``--context-window N`` declares the fake model's context window as N tokens: the sessions
go on for the whole run and compact whenever their conversation reaches the agent's
threshold (80 % of it); the provider answers every summary request with a short summary.
By default it is :data:`CONTEXT_WINDOW` (3,000), so that the soak's conversations, like
real ones, compact every few dozen turns: a real session's turns carry file contents and
tool output and fill a 128k-token window that soon; the soak's turns of a few words
compact at 3,000 tokens every ~60 of a session's turns (~250 compactions in 30
minutes). A slope then measures what the daemon keeps per turn, not how much longer the
conversations it resends have got.
``--context-window 0`` keeps the API's window (128k tokens for chat completions), which no
soak session reaches: every turn's request then grows for the whole run, and so does what
the turns in flight hold (``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

import psutil
from benchlib import (
    DAEMON_ENV,
    FakeProvider,
    ServiceProcess,
    Workspace,
    add_context_window_argument,
    daemon_launch_context,
    daemon_process,
    daemon_workspace,
    heading,
    percentile,
    run_with_daemons,
    running_service,
    slope_per_thousand,
    stop_service,
    write_provider_settings,
)

from magi_code.client import Client
from magi_code.endpoint.paths import runtime_paths
from magi_code.protocol import envelope

MIB = 2**20
FRONTENDS = 4
SESSIONS = 50
TURN_TIMEOUT = 120.0
SLOPE_AFTER_TURNS = 1000
CONTEXT_WINDOW = 3000  # tokens
# How long the daemon is left without turns before an idle sample: past its heap trim's
# interval, so that what the last turns freed has been collected and returned.
IDLE_SECONDS = 3.0
# Each shim runs this many turns at most (a closed stdin ends it sooner).
TURNS_PER_SHIM = (1, 6)
# (action, weight): what a frontend's next turn does.
ACTIONS = (
    ("plain", 50),
    ("shell", 14),
    ("grep", 8),
    ("mcp", 8),
    ("cancel_stream", 6),
    ("cancel_tool", 6),
    ("close_stdin", 8),
)
COLUMNS = (
    ("min", "elapsed_min", "{:>6.1f}"),
    ("turns", "turns", "{:>7d}"),
    ("rss_mib", "rss_mib", "{:>8.1f}"),
    ("uss_mib", "uss_mib", "{:>8.1f}"),
    ("fds", "open_fds", "{:>5d}"),
    ("thr", "threads", "{:>4d}"),
    ("kids", "children", "{:>5d}"),
    ("zomb", "zombies", "{:>5d}"),
    ("p50_ms", "p50_ms", "{:>7.1f}"),
    ("p95_ms", "p95_ms", "{:>7.1f}"),
)
SLOPED = ("rss_mib", "uss_mib", "open_fds", "threads", "children", "zombies")


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


def replies(action: str, n: int) -> list[dict[str, Any]]:
    """What the fake provider is given for one turn of ``action`` (any turn may take it:
    the provider's queue is shared, so the mix holds over many turns, not per turn)."""
    done = {"text": ["done ", "now"]}
    if action == "plain":
        return [{"kind": "fast", "count": 64}]
    if action == "shell":
        command = "echo soak; (sleep 0.2 &); ls >/dev/null"
        return [
            {"text": ["running "], "tool_calls": [call(f"s{n}", "shell", command=command)]},
            done,
        ]
    if action == "grep":
        return [
            {"text": ["searching "], "tool_calls": [call(f"g{n}", "grep", pattern="soak")]},
            done,
        ]
    if action == "mcp":
        clock = call(f"m{n}", "mcp__clock__get_current_time", timezone="UTC")
        return [{"text": ["asking "], "tool_calls": [clock]}, done]
    if action == "cancel_tool":
        return [
            {"text": ["waiting "], "tool_calls": [call(f"c{n}", "shell", command="sleep 5")]},
            done,
        ]
    # cancel_stream, close_stdin: a reply slow enough to be cut in the middle.
    return [{"text": ["slow "] * 40, "chunk_delay": 0.05}]


def _is_compaction(payload: dict[str, Any]) -> bool:
    activity = payload.get("activity") or {}
    return activity.get("kind") == "compaction" and activity.get("status") == "completed"


class Stats:
    def __init__(self) -> None:
        self.started = 0
        self.latencies: list[float] = []  # first-delta, seconds, since the last sample
        self.outcomes: collections.Counter[str] = collections.Counter()  # since last sample
        self.totals: collections.Counter[str] = collections.Counter()
        self.action_of: collections.Counter[str] = collections.Counter()
        self.compactions = 0  # compactions the turns reported as completed

    def outcome(self, name: str) -> None:
        self.outcomes[name] += 1
        self.totals[name] += 1


class Run:
    def __init__(self, args: argparse.Namespace, ws: Workspace, fake: FakeProvider) -> None:
        self.args = args
        self.ws = ws
        self.fake = fake
        self.stats = Stats()
        self.deadline = time.monotonic() + args.minutes * 60
        self.sessions: list[str | None] = [None] * SESSIONS
        self.session_turns = [0] * SESSIONS  # turns started on each slot's session
        self.used: set[str] = set()  # every session a turn ran on
        self.free = list(range(SESSIONS))
        self.rng = random.Random(args.seed)
        self.dumps = 0  # allocation reports asked of the daemon (--tracemalloc)
        self.resumed = asyncio.Event()  # cleared while an idle sample is taken
        self.resumed.set()

    def more(self) -> bool:
        return time.monotonic() < self.deadline and self.stats.started < self.args.turns

    async def frontend(self, index: int) -> None:
        while self.more():
            slot = self.free.pop(self.rng.randrange(len(self.free)))
            try:
                await self.one_shim(slot)
            finally:
                self.free.append(slot)

    async def one_shim(self, slot: int) -> None:
        svc = await ServiceProcess.start(self.ws.home, self.ws.project, DAEMON_ENV, checks=False)
        try:
            await svc.initialize()
            for _ in range(self.rng.randint(*TURNS_PER_SHIM)):
                if not self.more():
                    return
                action = self.rng.choices([a for a, _ in ACTIONS], [w for _, w in ACTIONS])[0]
                if not await self.one_turn(svc, slot, action):
                    return
        except EOFError:
            # A finding, not the end of the run: say what the shim said and go on.
            self.stats.outcome("shim_exited")
            said = (await svc.stderr_text()).strip().splitlines()
            print(f"   a shim exited: {said[-1] if said else 'nothing on stderr'}", flush=True)
        finally:
            await stop_service(svc)

    async def one_turn(self, svc: ServiceProcess, slot: int, action: str) -> bool:
        """Run one turn of ``action``; whether the shim can take another."""
        await self.resumed.wait()
        stats = self.stats
        stats.started += 1
        stats.action_of[action] += 1
        await self.fake.enqueue(*replies(action, stats.started))
        if self.session_turns[slot] == self.args.session_turns > 0:
            self.sessions[slot], self.session_turns[slot] = None, 0
        self.session_turns[slot] += 1
        rid = svc.next_id("turn")
        began = time.perf_counter()
        response = await svc.request(
            "turn.start", {"prompt": f"soak {action}", "options": {}},
            session_id=self.sessions[slot], request_id=rid, timeout=TURN_TIMEOUT,
        )  # fmt: skip
        if response["error"] is not None:
            stats.outcome(f"refused:{response['error']['code']}")
            return True
        payload = response["payload"]
        self.sessions[slot] = payload["session_id"]
        self.used.add(payload["session_id"])
        first = True
        async with asyncio.timeout(TURN_TIMEOUT):
            while True:
                event = await svc.recv(TURN_TIMEOUT)
                if event.get("kind") != "event" or event.get("request_id") != rid:
                    continue
                name = event["event"]
                if name == "turn.assistant_delta" and first:
                    first = False
                    stats.latencies.append(time.perf_counter() - began)
                    if action == "close_stdin":
                        await svc.close_stdin()
                        await svc.drain_stdout(TURN_TIMEOUT)
                        stats.outcome("stdin_closed")
                        return False
                    if action.startswith("cancel"):
                        cancel = {"turn_id": payload["turn_id"]}
                        await svc.send(
                            envelope.request(svc.next_id("cancel"), "turn.cancel", cancel)
                        )
                elif name == "turn.activity" and _is_compaction(event["payload"]):
                    stats.compactions += 1
                elif name == "turn.terminal":
                    stats.outcome(event["payload"]["status"])
                    return True

    async def snapshots(self, client: Client) -> None:
        """The persistent client's load: a snapshot of every known turn, over and over."""
        while self.more():
            await client.snapshot()
            await asyncio.sleep(0.5)

    async def sampler(
        self, client: Client, daemon: psutil.Process, rows: list[dict[str, Any]]
    ) -> None:
        began = time.monotonic()
        while True:
            done = not self.more()
            if self.args.idle_samples or self.args.tracemalloc:
                self.resumed.clear()
                await idle(client)
            rows.append(await self.sample(client, daemon, began))
            print_row(rows[-1])
            if self.args.tracemalloc:
                daemon.send_signal(signal.SIGUSR2)
                self.dumps += 1
                await allocation_report(self.ws, self.dumps)
            self.resumed.set()
            if done:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.args.interval):
                    while self.more():
                        await asyncio.sleep(0.2)

    async def sample(self, client: Client, daemon: psutil.Process, began: float) -> dict[str, Any]:
        health = dict(await client.status())
        stats = self.stats
        latencies, stats.latencies = stats.latencies, []
        outcomes, stats.outcomes = stats.outcomes, collections.Counter()
        return {
            "elapsed_min": (time.monotonic() - began) / 60,
            "turns": stats.started,
            "rss_mib": health["rss_bytes"] / MIB,
            "uss_mib": daemon.memory_full_info().uss / MIB,
            "open_fds": health["open_fds"],
            "threads": health["threads"],
            "children": sum(health["children"].values()),
            "zombies": health["zombies"],
            "p50_ms": percentile(latencies, 50) * 1000 if latencies else float("nan"),
            "p95_ms": percentile(latencies, 95) * 1000 if latencies else float("nan"),
            "outcomes": dict(outcomes),
        }


def print_header() -> None:
    print(
        "   "
        + " ".join(f"{title:>{len(fmt.format(0))}}" for title, _, fmt in COLUMNS)
        + "  outcomes"
    )


def print_row(row: Mapping[str, Any]) -> None:
    cells = [fmt.format(row[key]) for _, key, fmt in COLUMNS]
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items()))
    print("   " + " ".join(cells) + "  " + outcomes, flush=True)


def print_slopes(rows: list[dict[str, Any]]) -> None:
    late = [row for row in rows if row["turns"] >= SLOPE_AFTER_TURNS]
    if len(late) >= 2:
        fitted, note = late, f"after the first {SLOPE_AFTER_TURNS:,} turns"
    else:
        # Past the first sample, taken before the daemon loaded a turn's code.
        fitted = rows[1:] if len(rows) > 2 else rows
        note = f"whole run: fewer than {SLOPE_AFTER_TURNS:,} turns, not meaningful"
    print(f"   slope per 1,000 turns ({note}, {len(fitted)} samples):")
    units = {"rss_mib": "MiB", "uss_mib": "MiB"}
    for key in SLOPED:
        values = [float(row[key]) for row in fitted]
        fit = slope_per_thousand([row["turns"] for row in fitted], values)
        print(f"     {key:<10} {fit:+10.3f} {units.get(key, '')}".rstrip())
    # A leak grows in both halves; a bound filling (conversations reaching their window)
    # only in the first.
    half = fitted[len(fitted) // 2 :]
    if len(half) >= 2:
        rss = [float(row["rss_mib"]) for row in half]
        fit = slope_per_thousand([row["turns"] for row in half], rss)
        print(
            f"   rss_mib over the last {len(half)} of those samples (turns {half[0]['turns']:,}"
            f" to {half[-1]['turns']:,}): {rss[0]:.1f} -> {rss[-1]:.1f} MiB, {fit:+.3f} MiB"
            " per 1,000 turns"
        )


async def main(args: argparse.Namespace) -> None:
    heading(
        f"soak: {FRONTENDS} frontends, {SESSIONS} sessions, up to {args.minutes:g} min "
        f"or {args.turns:,} turns, a sample every {args.interval:g} s"
        + (f", a fresh session every {args.session_turns} turns" if args.session_turns else "")
        + (f", a {args.context_window:,}-token context" if args.context_window else ""),
        quick=False,
    )
    with daemon_workspace() as ws:
        (ws.project / "notes.txt").write_text("soak needle\n" * 20)
        async with FakeProvider.running() as fake:
            write_provider_settings(ws.home, fake.base_url, args.context_window)
            if args.context_window:
                await fake.answer_summaries()
            settings = json.loads((ws.home / "settings.json").read_text())
            settings["mcp_servers"] = {
                "clock": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
            }
            (ws.home / "settings.json").write_text(json.dumps(settings))
            run = Run(args, ws, fake)
            # The persistent client starts the daemon; an idle shim open for the whole run
            # keeps ServiceProcess from stopping the daemon whenever no other shim runs.
            async with (
                await Client.connect(daemon_launch_context(ws), client_name="soak") as client,
                running_service(ws, DAEMON_ENV),
            ):
                init = await client.request("initialize", {"supported_protocol_versions": [1]})
                if init["error"] is not None:
                    raise RuntimeError(f"initialize failed: {init['error']}")
                daemon = daemon_process(ws)
                rows: list[dict[str, Any]] = []
                print_header()
                await asyncio.gather(
                    run.sampler(client, daemon, rows),
                    run.snapshots(client),
                    *(run.frontend(i) for i in range(FRONTENDS)),
                )
                # The last turns' children are reaped; an orphan the daemon adopted is
                # reaped once it has been a zombie for a second. One still there after
                # 10 s is a finding.
                for _ in range(40):
                    await asyncio.sleep(0.25)
                    final = dict(await client.status())
                    if final["zombies"] == 0 and not any(final["children"].values()):
                        break
                if args.tracemalloc:
                    await keep_allocation_reports(ws, args.tracemalloc_dir)
            print_slopes(rows)
            totals = ", ".join(f"{k} {v}" for k, v in sorted(run.stats.totals.items()))
            print(f"   turns {run.stats.started:,} on {len(run.used)} sessions: {totals}")
            print(f"   compactions: {run.stats.compactions:,}")
            print(f"   at the end: children {final['children']}, zombies {final['zombies']}")


async def idle(client: Client) -> None:
    """Return once the daemon has run no turn for ``IDLE_SECONDS`` (the frontends start
    none meanwhile), or after ``TURN_TIMEOUT``: a turn that runs so long is a finding the
    sample shows, not a reason to stop sampling."""
    began = quiet_since = time.monotonic()
    while time.monotonic() - began < TURN_TIMEOUT:
        await asyncio.sleep(0.2)
        if (await client.status())["active_turns"]:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= IDLE_SECONDS:
            return


async def allocation_report(ws: Workspace, number: int) -> None:
    """Wait (up to 60 s) until the daemon has written ``tracemalloc-<number>.txt``."""
    report = runtime_paths(daemon_launch_context(ws)).state_dir / f"tracemalloc-{number}.txt"
    for _ in range(600):
        if report.exists():
            return
        await asyncio.sleep(0.1)


async def keep_allocation_reports(ws: Workspace, target: str) -> None:
    """Copy the daemon's ``tracemalloc-<n>.txt`` out of the temporary MC_HOME."""
    run_dir = runtime_paths(daemon_launch_context(ws)).state_dir
    os.makedirs(target, exist_ok=True)
    reports = sorted(run_dir.glob("tracemalloc-*.txt"))
    for report in reports:
        shutil.copy(report, target)
    print(f"   {len(reports)} allocation reports in {target}/")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="run at most this long")
    parser.add_argument("--turns", type=int, default=5000, help="start at most this many turns")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run's choices")
    parser.add_argument(
        "--tracemalloc", type=int, default=0, metavar="FRAMES",
        help="trace the daemon's allocations with this many frames, a report per sample",
    )  # fmt: skip
    parser.add_argument("--tracemalloc-dir", default="soak-tracemalloc")
    parser.add_argument(
        "--idle-samples", action="store_true",
        help="take every sample with the daemon idle (always so with --tracemalloc)",
    )  # fmt: skip
    parser.add_argument(
        "--session-turns", type=int, default=0, metavar="N",
        help="start a fresh session after N turns on one (default 0: sessions only grow)",
    )  # fmt: skip
    add_context_window_argument(parser, CONTEXT_WINDOW)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.tracemalloc:
        # Every daemon this run starts (the first client starts it) is traced.
        DAEMON_ENV["MC_DAEMON_TRACEMALLOC"] = str(arguments.tracemalloc)
    run_with_daemons(main, "soak", arguments)
