"""Start-up, the first turn of a new process, exit, and idle memory (issue 14).

Every sample is a new process, so the figures include interpreter start and imports:

- spawn -> ``initialize`` response: embedded; the shim with a warm daemon (started by
  ``magi-code daemon start`` beforehand); the shim with no daemon running (cold: the
  shim's ``initialize`` starts one).
- the first turn of a new process, ``turn.start`` written -> first
  ``turn.assistant_delta`` read: embedded (sent right after ``initialize``, and once more
  after 1 s of idle time); through a shim to a warm daemon that has not run a turn yet;
  and right after a cold start (the daemon the shim's ``initialize`` started). The
  second turn of the same process is printed beside it for comparison.
- stdin EOF -> process exit, after a turn: embedded and shim; and embedded right after
  ``initialize`` (while the service may still be loading its modules).
- idle RSS 0.5 s after a turn without MCP servers: the embedded service; the shim plus the
  daemon; the daemon alone before its first turn and after it (no client connected).
  ``python -c pass`` and ``python -c "import msgpack, orjson"`` (each blocked on stdin)
  are printed for scale.

With ``--codex PATH`` (the codex CLI's native binary), the same run also times
``codex app-server`` from spawn to its ``initialize`` response under a temporary
``CODEX_HOME``, after one unmeasured start: the reference a cold start is held to.

Medians of 7 samples (with ``--quick`` one, and no pause before memory is read or before
the turn after idle time). The loopback fake provider streams 50 deltas per turn. Every
daemon runs for a temporary MC_HOME with ``MC_DAEMON_NO_SCOPE=1`` and is stopped
(``daemon stop`` over the control protocol, then killed) when the script ends, also on
errors and SIGTERM.

    .venv/bin/python benchmarks/bench_startup.py [--quick] [--codex PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
import psutil
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    FakeProvider,
    ServiceProcess,
    Workspace,
    argument_parser,
    compile_package,
    daemon_command,
    daemon_process,
    daemon_workspace,
    figure,
    heading,
    median,
    run_with_daemons,
    stop_service,
    workspace,
    write_provider_settings,
)
from tests.support.service import stop_daemon

MIB = 2**20
STEP_TIMEOUT = 60.0
SETTLE_SECONDS = 0.5
IDLE_BEFORE_TURN_SECONDS = 1.0
TURN_DELTAS = 50


@dataclass
class Samples:
    """Seconds (or bytes) per figure, over all samples of a phase."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def ms(self, name: str, label: str, reference: str | None = None) -> None:
        figure(label, median(self.values[name]) * 1e3, "ms", reference)

    def mib(self, name: str, label: str, reference: str | None = None) -> None:
        figure(label, median(self.values[name]) / MIB, "MiB", reference)


def samples_count(args: argparse.Namespace) -> int:
    return 1 if args.quick else 7


async def pause(args: argparse.Namespace, seconds: float) -> None:
    """Let memory settle or the service idle; a quick run goes on at once."""
    await asyncio.sleep(0 if args.quick else seconds)


# -- processes -------------------------------------------------------------------------------


def rss(proc: psutil.Process | int) -> int:
    process = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
    return int(process.memory_info().rss)


async def spawn(ws: Workspace, env: Mapping[str, str]) -> tuple[ServiceProcess, float]:
    """A new service process and the seconds from its creation to its ``initialize``
    response."""
    start = time.perf_counter()
    service = await ServiceProcess.start(ws.home, ws.project, env, checks=False)
    try:
        await service.initialize()
    except BaseException:
        await stop_service(service)
        raise
    return service, time.perf_counter() - start


async def eof_to_exit(service: ServiceProcess) -> float:
    start = time.perf_counter()
    await service.close_stdin()
    await asyncio.wait_for(service.proc.wait(), STEP_TIMEOUT)
    return time.perf_counter() - start


async def first_delta(service: ServiceProcess, fake: FakeProvider) -> float:
    """Seconds from writing ``turn.start`` to reading its first assistant delta; reads on
    to the terminal."""
    await fake.enqueue({"kind": "fast", "count": TURN_DELTAS})
    request_id = service.next_id("turn")
    record = {
        "protocol_version": 1,
        "kind": "request",
        "request_id": request_id,
        "method": "turn.start",
        "payload": {"prompt": "Say something.", "options": {}},
    }
    start = time.perf_counter()
    await service.send(record)
    delta: float | None = None
    while True:
        message = await service.recv(STEP_TIMEOUT)
        if message.get("request_id") != request_id:
            continue
        if message["kind"] == "response":
            if message["error"] is not None:
                raise RuntimeError(f"turn.start failed: {message['error']}")
        elif message["event"] == "turn.assistant_delta" and delta is None:
            delta = time.perf_counter() - start
        elif message["event"] == "turn.terminal":
            if message["payload"]["status"] != "completed":
                raise RuntimeError(f"turn ended {message['payload']['status']}")
            break
    if delta is None:
        raise RuntimeError("the turn produced no delta")
    return delta


# -- scale -----------------------------------------------------------------------------------


async def python_scale(args: argparse.Namespace) -> None:
    times: list[float] = []
    for _ in range(samples_count(args)):
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
        await proc.wait()
        times.append(time.perf_counter() - start)
    figure("python -c pass, spawn -> exit", median(times) * 1e3, "ms")
    for label, code in (
        ("python -c pass", "import sys; sys.stdin.buffer.read()"),
        ('python -c "import msgpack, orjson"', "import sys, msgpack, orjson; sys.stdin.read()"),
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE
        )
        try:
            await pause(args, SETTLE_SECONDS)
            figure(f"RSS, {label}", rss(proc.pid) / MIB, "MiB")
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            await proc.wait()


# -- phases ----------------------------------------------------------------------------------


async def embedded_phase(args: argparse.Namespace, fake: FakeProvider) -> None:
    samples = Samples()
    idle = 0.0 if args.quick else IDLE_BEFORE_TURN_SECONDS
    with workspace() as ws:
        write_provider_settings(ws.home, fake.base_url)
        for _ in range(samples_count(args)):
            service, took = await spawn(ws, EMBEDDED_ENV)
            try:
                samples.add("init", took)
                samples.add("turn1", await first_delta(service, fake))
                samples.add("turn2", await first_delta(service, fake))
                await pause(args, SETTLE_SECONDS)
                samples.add("rss", rss(service.proc.pid))
                samples.add("exit", await eof_to_exit(service))
            finally:
                await stop_service(service)
            service, _ = await spawn(ws, EMBEDDED_ENV)
            try:
                await asyncio.sleep(idle)
                samples.add("turn1_idle", await first_delta(service, fake))
            finally:
                await stop_service(service)
            service, _ = await spawn(ws, EMBEDDED_ENV)
            try:
                samples.add("exit_init", await eof_to_exit(service))
            finally:
                await stop_service(service)
    n = samples_count(args)
    samples.ms("init", f"spawn -> initialize, embedded, median of {n}", "codex app-server ~56 ms")
    samples.ms("turn1", "turn 1 start -> first delta, embedded, at once")
    samples.ms(
        "turn1_idle",
        f"turn 1 start -> first delta, embedded, {idle:.0f} s idle",
    )
    samples.ms("turn2", "turn 2 start -> first delta, embedded")
    samples.ms("exit", "EOF -> exit after a turn, embedded")
    samples.ms("exit_init", "EOF -> exit right after initialize, embedded")
    samples.mib("rss", "idle RSS after a turn, embedded service")


class DaemonReplaced(Exception):
    """The daemon measured was replaced by another (its package files changed meanwhile)."""


def same_daemon(ws: Workspace, daemon: psutil.Process) -> None:
    try:
        current = daemon_process(ws)
    except RuntimeError:
        raise DaemonReplaced from None
    if current != daemon or not daemon.is_running():
        raise DaemonReplaced


async def warm_sample(
    args: argparse.Namespace, ws: Workspace, fake: FakeProvider, samples: Samples
) -> None:
    """One sample on a new daemon, so the measured turn is the daemon's first; nothing is
    added to ``samples`` unless the same daemon served the whole sample."""
    await daemon_command(ws, "start")
    daemon = daemon_process(ws)
    await pause(args, SETTLE_SECONDS)
    taken = Samples()
    taken.add("daemon_before", rss(daemon))
    service, took = await spawn(ws, DAEMON_ENV)
    try:
        same_daemon(ws, daemon)
        taken.add("init", took)
        taken.add("turn1", await first_delta(service, fake))
        taken.add("turn2", await first_delta(service, fake))
        await pause(args, SETTLE_SECONDS)
        taken.add("rss_total", rss(service.proc.pid) + rss(daemon))
        taken.add("rss_shim", rss(service.proc.pid))
        taken.add("exit", await eof_to_exit(service))
        await pause(args, SETTLE_SECONDS)
        same_daemon(ws, daemon)
        taken.add("daemon_after", rss(daemon))
    except psutil.NoSuchProcess:
        raise DaemonReplaced from None
    finally:
        # The last shim of this home: stopping it also stops the daemon.
        await stop_service(service)
    for name, values in taken.values.items():
        for value in values:
            samples.add(name, value)


async def warm_daemon_phase(args: argparse.Namespace, fake: FakeProvider) -> None:
    samples = Samples()
    replaced = 0
    with daemon_workspace() as ws:
        write_provider_settings(ws.home, fake.base_url)
        while len(samples.values.get("init", [])) < samples_count(args):
            try:
                await warm_sample(args, ws, fake, samples)
            except DaemonReplaced:
                # Files of the package changed (an edit in the checkout): a new build's
                # shim replaced the daemon, so this sample measured something else.
                replaced += 1
                if replaced > 3 * samples_count(args):
                    raise RuntimeError("the daemon keeps being replaced") from None
                stop_daemon(ws.home)
    n = samples_count(args)
    samples.ms("init", f"spawn -> initialize, shim, warm daemon, median of {n}")
    samples.ms("turn1", "turn 1 start -> first delta, warm daemon (its first)")
    samples.ms("turn2", "turn 2 start -> first delta, warm daemon")
    samples.ms("exit", "EOF -> exit after a turn, shim")
    samples.mib("rss_total", "idle RSS after a turn, shim + daemon")
    samples.mib("rss_shim", "  of which the shim")
    samples.mib("daemon_before", "daemon idle RSS before its first turn")
    samples.mib("daemon_after", "daemon idle RSS after it (no client)")
    before = samples.values["daemon_before"]
    after = samples.values["daemon_after"]
    figure(
        "  difference, median of per-daemon differences",
        median([a - b for a, b in zip(after, before, strict=True)]) / MIB,
        "MiB",
    )
    if replaced:
        print(f"   ({replaced} samples retried: the daemon was replaced by another build)")


async def cold_daemon_phase(args: argparse.Namespace, fake: FakeProvider) -> None:
    samples = Samples()
    with daemon_workspace() as ws:
        write_provider_settings(ws.home, fake.base_url)
        for _ in range(samples_count(args)):
            service, took = await spawn(ws, DAEMON_ENV)
            try:
                daemon_process(ws)
                samples.add("init", took)
                samples.add("turn1", await first_delta(service, fake))
                samples.add("exit", await eof_to_exit(service))
            finally:
                await stop_service(service)  # and the daemon: the next sample is cold again
    n = samples_count(args)
    samples.ms("init", f"spawn -> initialize, shim, cold daemon, median of {n}")
    samples.ms("turn1", "turn 1 start -> first delta, after a cold start")
    samples.ms("exit", "EOF -> exit after a turn, shim (cold start)")


CODEX_INITIALIZE = {
    "id": 1,
    "method": "initialize",
    "params": {"clientInfo": {"name": "bench", "title": "bench", "version": "0"}},
}


async def codex_start(codex: str, env: Mapping[str, str]) -> float:
    """Seconds from spawning ``codex app-server`` to reading its ``initialize`` result."""
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        codex,
        "app-server",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(orjson.dumps(CODEX_INITIALIZE) + b"\n")
        line = await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)
        took = time.perf_counter() - start
        if "result" not in orjson.loads(line):
            raise RuntimeError(f"codex app-server did not initialize: {line[:200]!r}")
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return took


async def codex_phase(args: argparse.Namespace) -> None:
    samples = Samples()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "CODEX_HOME": home}
        await codex_start(args.codex, env)  # its binary into the page cache
        for _ in range(samples_count(args)):
            samples.add("init", await codex_start(args.codex, env))
    n = samples_count(args)
    samples.ms("init", f"spawn -> initialize, codex app-server, median of {n}")


async def main(args: argparse.Namespace) -> None:
    heading("bench_startup: start-up, first turn, exit, idle memory", args.quick)
    compile_package()
    await python_scale(args)
    async with FakeProvider.running() as fake:
        await embedded_phase(args, fake)
        await warm_daemon_phase(args, fake)
        await cold_daemon_phase(args, fake)
    if args.codex:
        await codex_phase(args)


def arguments() -> argparse.Namespace:
    parser = argument_parser(__doc__ or "")
    parser.add_argument("--codex", metavar="PATH", help="also time this codex binary's start")
    return parser.parse_args()


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "", arguments())
