"""Paired A/B of spawn -> ``initialize`` between builds, in one start-up mode.

    .venv/bin/python benchmarks/ab_startup.py [--quick] [--pairs N] [--mode MODE]
        SPEC SPEC [SPEC ...]

Each ``SPEC`` is ``NAME=PYTHON``: an interpreter whose environment has the build to
measure installed (for another commit: ``git worktree add ../base <rev>; make -C ../base
.venv/.installed-stamp``, then ``base=../base/.venv/bin/python now=.venv/bin/python``).
``MODE`` is ``warm`` (the default mode as a frontend meets it most: the shim, to a daemon
that already runs, kept by another shim of the same build that stays connected), ``cold``
(the shim with no daemon running: its ``initialize`` starts one; the daemon is gone before
the next sample) or ``embedded``. Each sample is a new process, from its creation to its
``initialize`` response; it is then stopped (stdin EOF). Beside that time, the CPU
(user + system) the start cost by then: the new process's, and in ``cold`` mode the
daemon's too (which may include the start of its warm-up of the HTTP stack, begun once it
was ready). It moves much less with the machine's load than the time does.

This machine's speed drifts, so the builds' samples alternate (A, B, B, A, ...): each pair
meets the same phase. Printed per build: the median and quartiles of its spawn ->
``initialize`` times and CPU, and the median and quartiles of its per-pair ratios to the
first ``SPEC``.

``--quick`` is a smoke run: one pair (unless ``--pairs`` says otherwise), and no
unmeasured sample first; its figures are not meaningful.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

import psutil
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    ServiceProcess,
    Workspace,
    argument_parser,
    compile_package,
    daemon_process,
    daemon_workspace,
    quartiles,
    run_with_daemons,
    running_service,
    stop_service,
    workspace,
)

MODES = ("warm", "cold", "embedded")
DAEMON_EXIT_TIMEOUT = 30.0


@dataclass
class Build:
    name: str
    python: str
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def parse_spec(spec: str) -> Build:
    name, sep, python = spec.partition("=")
    if not sep or not name or not python:
        raise argparse.ArgumentTypeError(f"not NAME=PYTHON: {spec!r}")
    # Absolute, as given: a virtual environment's interpreter is a link not to follow.
    return Build(name, os.path.abspath(python))


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def exited(process: psutil.Process, timeout: float) -> None:
    """Return once ``process`` has exited. A zombie has: the daemon's parent is init (the
    shim that started it is gone), and some inits reap a second or more later."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while process.is_running():
        with contextlib.suppress(psutil.NoSuchProcess):  # reaped meanwhile: the test sees it
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        if loop.time() > deadline:
            raise TimeoutError(f"the daemon (pid {process.pid}) did not exit")
        await asyncio.sleep(0.01)


async def sample(build: Build, ws: Workspace, mode: str) -> tuple[float, float]:
    """Seconds from spawning the service to reading its ``initialize`` response, and the
    CPU seconds the start cost by then."""
    env = EMBEDDED_ENV if mode == "embedded" else DAEMON_ENV
    start = time.perf_counter()
    service = await ServiceProcess.start(
        ws.home, ws.project, env, checks=False, python=build.python
    )
    try:
        await service.initialize()
        took = time.perf_counter() - start
        daemon = daemon_process(ws) if mode == "cold" else None
        cpu = cpu_seconds(psutil.Process(service.proc.pid))
        cpu += cpu_seconds(daemon) if daemon is not None else 0.0
    finally:
        await stop_service(service)
    if daemon is not None:
        # The last shim of the home stops its daemon: the next sample starts cold again.
        await exited(daemon, DAEMON_EXIT_TIMEOUT)
    return took, cpu


async def main(args: argparse.Namespace) -> None:
    builds: list[Build] = args.builds
    print(f"== ab_startup: spawn -> initialize, {args.mode}, {args.pairs} pairs, alternating")
    async with contextlib.AsyncExitStack() as stack:
        places: list[Workspace] = []
        for build in builds:
            compile_package(build.python)
            ws = stack.enter_context(workspace() if args.mode == "embedded" else daemon_workspace())
            places.append(ws)
            if args.mode == "warm":
                # Starts this build's daemon and keeps it running between the samples.
                await stack.enter_async_context(
                    running_service(ws, DAEMON_ENV, python=build.python)
                )
            if not args.quick:
                # One unmeasured sample each: the files it reads are then in the page cache.
                await sample(build, ws, args.mode)
        pairs = list(zip(builds, places, strict=True))
        for pair in range(args.pairs):
            for build, ws in pairs[:: 1 if pair % 2 == 0 else -1]:
                took, cpu = await sample(build, ws, args.mode)
                build.times.append(took)
                build.cpu.append(cpu)
    first = builds[0]
    for label, of in (("time", lambda b: b.times), ("CPU", lambda b: b.cpu)):
        for build in builds:
            low, middle, high = quartiles(of(build))
            print(
                f"   {build.name}, {label}: median {middle * 1e3:.1f} ms "
                f"(quartiles {low * 1e3:.1f} .. {high * 1e3:.1f})"
            )
        for build in builds[1:]:
            low, middle, high = quartiles(
                [a / b for a, b in zip(of(build), of(first), strict=True)]
            )
            print(
                f"   {build.name} / {first.name}, {label}: median ratio {middle:.3f} "
                f"(quartiles {low:.3f} .. {high:.3f})"
            )


def arguments() -> argparse.Namespace:
    parser = argument_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--pairs", type=int, help="samples per build (default 30, quick 1)")
    parser.add_argument("--mode", choices=MODES, default="warm", help="start-up mode")
    parser.add_argument("builds", nargs="+", type=parse_spec, metavar="SPEC")
    args = parser.parse_args()
    if args.pairs is None:
        args.pairs = 1 if args.quick else 30
    if len(args.builds) < 2 or args.pairs < 1:
        parser.error("give two SPECs or more and --pairs 1 or more")
    return args


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "", arguments())
