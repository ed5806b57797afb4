"""Shared pieces of the benchmark scripts: workspaces, real processes, statistics, output.

Every benchmark drives real processes: the service (``python -m magi_code --app service``
through ``tests.support.service.ServiceProcess``) and, when a model is needed, the loopback
fake provider as its own process (``python -m tests.support.fake_providers``), so the
benchmark client, the service and the provider do not share an interpreter or a GIL.
Everything runs under a fresh temporary MC_HOME/project that is removed afterwards, and
every process is stopped (killed if needed) even when a benchmark fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Scripts run as ``python benchmarks/<name>.py``: make the repository's test helpers
# importable the same way pytest does.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402
from tests.support.service import ServiceProcess, service_env, stop_daemon  # noqa: E402

from magi_code.endpoint.paths import read_info, runtime_paths  # noqa: E402
from magi_code.protocol import envelope  # noqa: E402
from magi_code.sessions.records import encode_record, now_rfc3339  # noqa: E402
from magi_code.storage.launch import LaunchContext  # noqa: E402
from magi_code.storage.stamps import RACY_WINDOW_NS  # noqa: E402
from magi_code.turns.context import SUMMARY_PROMPT  # noqa: E402

__all__ = [
    "DAEMON_ENV",
    "EMBEDDED_ENV",
    "ROOT",
    "FakeProvider",
    "ServiceProcess",
    "Workspace",
    "daemon_command",
    "daemon_launch_context",
    "daemon_process",
    "daemon_workspace",
    "figure",
    "heading",
    "kill_seen_daemons",
    "median",
    "outwait_racy_window",
    "parse_args",
    "percentile",
    "quartiles",
    "rss_bytes",
    "run",
    "run_with_daemons",
    "running_service",
    "settle",
    "stop_service",
    "workspace",
    "write_provider_settings",
]

PROCESS_TIMEOUT = 30.0
DAEMON_COMMAND_TIMEOUT = 60.0
# No systemd scope (the daemon stays where we can find and kill it); the idle stop is a
# safety net should every cleanup fail (the daemon always has a client or a turn while it
# is measured, so it never fires during a run).
DAEMON_ENV = {
    "MC_SERVICE_MODE": "daemon",
    "MC_DAEMON_NO_SCOPE": "1",
    "MC_DAEMON_IDLE_SECONDS": "60",
}
EMBEDDED_ENV = {"MC_SERVICE_MODE": "embedded"}


def argument_parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (``--quick``); a script may add its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="small smoke run (seconds), figures not meaningful"
    )
    return parser


def add_context_window_argument(parser: argparse.ArgumentParser, default: int = 0) -> None:
    """``--context-window N``: the fake model's window (``write_provider_settings``)."""
    parser.add_argument(
        "--context-window", type=int, default=default, metavar="N",
        help=f"the model's context window in tokens: conversations compact at 80%% of it "
        f"(default {default}; 0 is the API's window, which none of these conversations reaches)",
    )  # fmt: skip


def parse_args(description: str) -> argparse.Namespace:
    return argument_parser(description).parse_args()


def run(
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
    description: str,
    args: argparse.Namespace | None = None,
) -> None:
    """Parse ``--quick`` (unless the script parsed its own ``args``) and run ``main`` on
    the same event loop the service uses.

    SIGTERM is turned into KeyboardInterrupt so the context managers still stop every
    process and remove every temporary directory when a runner stops the script.
    """
    if args is None:
        args = parse_args(description)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(main(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def run_with_daemons(
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
    description: str,
    args: argparse.Namespace | None = None,
) -> None:
    """``run`` for a script that starts daemons. SIGTERM/SIGINT cancel ``main``'s task, so
    every await unwinds through the cleanups in order (an interrupt raised inside a
    transport callback would skip some of them); every daemon seen is killed at the end."""

    async def cancellable(args: argparse.Namespace) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        try:
            await main(args)
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None

    try:
        run(cancellable, description, args)
    finally:
        kill_seen_daemons()


# -- output ---------------------------------------------------------------------------------


# ``py_compile`` writes the files even under ``PYTHONDONTWRITEBYTECODE=1``.
COMPILE_PACKAGE = (
    "import compileall, importlib.util; "
    "spec = importlib.util.find_spec('magi_code'); "
    "compileall.compile_dir(spec.submodule_search_locations[0], quiet=1)"
)


def compile_package(python: str = sys.executable) -> None:
    """Write the bytecode of the ``magi_code`` that ``python`` imports, before start-ups
    are measured: an editable install has none, and under ``PYTHONDONTWRITEBYTECODE=1``
    (set in some environments) every process would otherwise compile the package from
    source (on a cold start, the shim's and the daemon's share: ~200 ms more)."""
    subprocess.run([python, "-c", COMPILE_PACKAGE], check=True, stdout=subprocess.DEVNULL)


def heading(title: str, quick: bool) -> None:
    mode = " (quick smoke run: figures are not meaningful)" if quick else ""
    cpus = os.cpu_count()
    print(f"== {title}{mode}")
    print(f"   python {platform.python_version()}, {cpus} CPUs, {platform.platform()}")


def figure(label: str, value: float, unit: str, reference: str | None = None) -> None:
    """One result line; ``reference`` is the comparison figure printed beside it."""
    if isinstance(value, int) or value >= 100:
        shown = f"{value:,.0f}"
    elif value >= 10:
        shown = f"{value:.1f}"
    else:
        shown = f"{value:.3f}"
    line = f"   {label:<52} {shown:>12} {unit}"
    if reference:
        line += f"   [reference: {reference}]"
    print(line, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def slope_per_thousand(turns: list[float], values: list[float]) -> float:
    """The least-squares slope of ``values`` per 1,000 turns (0 when nothing can be fitted:
    fewer than two distinct turn counts)."""
    if len(set(turns)) < 2:
        return 0.0
    return statistics.linear_regression(turns, values).slope * 1000


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation: a real observed sample)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


# -- temporary MC_HOME / project ------------------------------------------------------------


@dataclass(frozen=True)
class Workspace:
    root: Path
    home: Path
    project: Path


@contextlib.contextmanager
def workspace() -> Iterator[Workspace]:
    """A fresh MC_HOME and project directory (never the real home), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="mc-bench-") as tmp:
        root = Path(tmp)
        home = root / "home"
        project = root / "project"
        home.mkdir()
        project.mkdir()
        (root / "user-home").mkdir()
        yield Workspace(root, home, project)


def write_provider_settings(home: Path, base_url: str, context_window: int = 0) -> None:
    """Select a custom chat-completions provider at ``base_url`` (the fake provider),
    whose model has a ``context_window`` of that many tokens (0: the API's, 128k)."""
    provider: dict[str, Any] = {"api": "openai-chat", "base_url": f"{base_url}/v1"}
    if context_window:
        provider["context_window"] = context_window
    doc = {"provider": "local", "model": "m1", "providers": {"local": provider}}
    (home / "settings.json").write_text(json.dumps(doc))


# -- processes ------------------------------------------------------------------------------


async def stop_service(service: ServiceProcess) -> None:
    """Stop the service (stdin EOF), killing it if it does not exit."""
    try:
        await service.stop()
    finally:
        if service.proc.returncode is None:
            service.proc.kill()
            await service.proc.wait()


@contextlib.asynccontextmanager
async def running_service(
    ws: Workspace,
    env: Mapping[str, str] | None = None,
    *,
    initialize: bool = True,
    python: str | None = None,
) -> AsyncIterator[ServiceProcess]:
    """The real stdio service for ``ws`` (run by ``python``, else this interpreter); stdin
    closed (then killed if needed) on exit."""
    service = await ServiceProcess.start(ws.home, ws.project, env, checks=False, python=python)
    try:
        if initialize:
            await service.initialize()
        yield service
    finally:
        await stop_service(service)


# -- the per-user daemon --------------------------------------------------------------------

# Every daemon process seen, so the last-resort sweep at exit can kill it (psutil.Process
# remembers the create time: a reused pid is never killed).
_daemons: list[psutil.Process] = []


def daemon_launch_context(ws: Workspace) -> LaunchContext:
    """The context a frontend of ``ws`` would send (same env the shims get)."""
    return LaunchContext(ws.home, ws.project, service_env(ws.home, DAEMON_ENV))


def daemon_process(ws: Workspace) -> psutil.Process:
    """The running daemon of ``ws`` (from ``daemon.json``), remembered for the exit sweep."""
    info = read_info(runtime_paths(daemon_launch_context(ws))) or {}
    pid = info.get("pid")
    if not isinstance(pid, int):
        raise RuntimeError("no daemon.json with a pid: the daemon is not running")
    proc = psutil.Process(pid)
    if proc not in _daemons:
        _daemons.append(proc)
    return proc


def kill_seen_daemons() -> None:
    """Kill every daemon ``daemon_process`` has seen (the last-resort sweep at exit)."""
    for proc in _daemons:
        with contextlib.suppress(psutil.Error):
            proc.kill()


@contextlib.contextmanager
def daemon_workspace() -> Iterator[Workspace]:
    """A workspace whose daemon (if one was started) is stopped before it is removed."""
    with workspace() as ws:
        try:
            yield ws
        finally:
            # Synchronous on purpose: it cannot be cancelled half way.
            stop_daemon(ws.home)


async def daemon_command(ws: Workspace, *args: str) -> None:
    """Run ``magi-code daemon <args>`` for ``ws``; raise if it fails."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magi_code",
        "daemon",
        *args,
        env=service_env(ws.home, DAEMON_ENV),
        cwd=ws.project,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), DAEMON_COMMAND_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"daemon {' '.join(args)} failed: {err.decode(errors='replace')}")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` plus any child processes it started."""
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total


class FakeProvider:
    """The loopback fake provider as a separate process, scripted over its control routes.

    Replies use the JSON form of ``tests.support.fake_providers`` (``{"kind": "fast",
    "count": N}``, ``{"text": [...], "tool_calls": [...]}``).
    """

    def __init__(self, proc: asyncio.subprocess.Process, base_url: str) -> None:
        self.proc = proc
        self.base_url = base_url
        self.client = httpx.AsyncClient(base_url=base_url, timeout=PROCESS_TIMEOUT)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls) -> AsyncIterator[FakeProvider]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.fake_providers",
            "--port",
            "0",
            "--no-record",  # a turn's tens of MiB of request bodies, kept, would grow it
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        fake: FakeProvider | None = None
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), PROCESS_TIMEOUT)
            if not line:
                raise RuntimeError("fake provider exited before announcing its port")
            fake = cls(proc, json.loads(line)["base_url"])
            yield fake
        finally:
            if fake is not None:
                await fake.client.aclose()
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()

    async def enqueue(self, *replies: Mapping[str, Any]) -> None:
        response = await self.client.post("/__fake__/enqueue", json=list(replies))
        response.raise_for_status()

    async def route(self, marker: str, default: Mapping[str, Any]) -> None:
        """Answer every request whose body contains ``marker`` with ``default``."""
        response = await self.client.post(
            "/__fake__/route", json={"marker": marker, "default": dict(default)}
        )
        response.raise_for_status()

    async def answer_summaries(self) -> None:
        """Answer every compaction's summary request with a short summary."""
        await self.route(SUMMARY_PROMPT, {"text": ["The conversation so far, in brief."]})

    async def pending(self) -> int:
        response = await self.client.get("/__fake__/state")
        response.raise_for_status()
        pending: int = response.json()["pending"]
        return pending


async def outwait_racy_window(quick: bool) -> None:
    """Wait until what a fresh home and project were given is older than
    ``RACY_WINDOW_NS``, within which the service reads it again on every use (a user's
    files usually are); not in a quick run, whose figures are not meaningful."""
    if not quick:
        await asyncio.sleep(RACY_WINDOW_NS / 1e9 + 0.3)


async def settle(service: ServiceProcess, quick: bool) -> None:
    """Let a fresh home go quiet before ``status`` is measured: the first ``status`` waits
    for the service's background load (which writes the settings schema), then the racy
    window passes (``status`` re-reads settings and the auth store while anything it
    stamps changed less than ``RACY_WINDOW_NS`` ago)."""
    await service.request("status")
    await outwait_racy_window(quick)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """The lower quartile, median and upper quartile of ``values`` (all three the value
    itself when there is one: a quick run's one pair)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, middle, high = statistics.quantiles(values, n=4)
    return low, middle, high


async def pipelined_status_rate(service: ServiceProcess, count: int) -> float:
    """Requests/s for ``count`` status requests written back to back while the responses
    are read concurrently (writing everything first would deadlock once both pipe
    buffers fill)."""
    batch = b"".join(
        orjson.dumps(envelope.request(f"pipe-{i}", "status")) + b"\n" for i in range(count)
    )
    began = time.perf_counter()
    writer = asyncio.create_task(service.send_raw(batch))
    try:
        for _ in range(count):
            message = await service.recv()
            if message["kind"] != "response" or message["error"] is not None:
                raise RuntimeError(f"unexpected message: {message}")
        return count / (time.perf_counter() - began)
    finally:
        await writer


def write_short_turns(history: Path, target_bytes: int) -> None:
    """Append short turns (a prompt, a reply, its terminal: ~150 bytes a record, every
    text its own) to the session history at ``history`` until it holds about
    ``target_bytes``: written straight to the file (not fsynced), numbered on from its
    header."""
    stamp = now_rfc3339()
    with history.open("ab") as fh:
        seq, written = 1, history.stat().st_size
        while written < target_bytes:
            turn_id, reply = f"turn_{seq:024x}", f"reply {seq:07d}"
            for record in (
                {"type": "user", "turn_id": turn_id, "text": f"prompt {seq:07d}"},
                {"type": "assistant", "turn_id": turn_id, "text": reply},
                {
                    "type": "terminal",
                    "turn_id": turn_id,
                    "status": "completed",
                    "assistant_text": reply,
                },
            ):
                line = encode_record(record, seq, stamp)
                fh.write(line)
                seq, written = seq + 1, written + len(line)
