"""Paired A/B of ``bench_activity.py``'s tool-heavy turn, between builds or modes.

    .venv/bin/python benchmarks/ab_activity.py [--quick] [--pairs N] [--shape RxC]
        [--chunk-delay S] SPEC SPEC [SPEC ...]

Each ``SPEC`` is ``NAME=PYTHON[:MODE]``: ``PYTHON`` is an interpreter whose environment
has the build to measure installed, and ``MODE`` is ``daemon`` (the default) or
``embedded``. To measure another commit, check it out beside this one and install it
there (``git worktree add ../base <rev>; make -C ../base .venv/.installed-stamp``), then
pass ``base=../base/.venv/bin/python now=.venv/bin/python``; ``now=.venv/bin/python:embedded
now-daemon=.venv/bin/python`` compares the two modes of one build.

This machine's speed can change by 2x within minutes, so runs of one build after another
compare the machine's phases more than the builds. Here every service runs at once, each
with its own ``MC_HOME``, project and fake provider (the fake provider of this checkout,
the same for all), and their turns alternate (A, B, B, A, ...): each pair of turns meets
the same phase. Printed per build: the median activity events/s and event-loop CPU per
turn, and the median and quartiles of its per-pair ratios to the first ``SPEC``.

``--chunk-delay S`` makes every tool-call reply a paced one: 50 one-character text chunks,
``S`` seconds apart, before its calls (0.02: a reply takes about a second, as a real
provider's does), so the ratios are those of a turn against a provider that paces its
stream.

``--quick`` is a smoke run: one pair of 1x1 turns (unless ``--pairs`` or ``--shape`` say
otherwise), without first waiting out the racy window; its figures are not meaningful.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from dataclasses import dataclass, field

import psutil
from bench_activity import measured_turn, populate_project, service_processes, warm_up
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    FakeProvider,
    ServiceProcess,
    argument_parser,
    daemon_workspace,
    outwait_racy_window,
    quartiles,
    run_with_daemons,
    running_service,
    workspace,
    write_provider_settings,
)

MODES = {"daemon": (DAEMON_ENV, daemon_workspace), "embedded": (EMBEDDED_ENV, workspace)}


@dataclass
class Build:
    name: str
    python: str
    mode: str
    rates: list[float] = field(default_factory=list)
    loop_cpu: list[float] = field(default_factory=list)


def parse_spec(spec: str) -> Build:
    name, sep, rest = spec.partition("=")
    python, _, mode = rest.partition(":")
    mode = mode or "daemon"
    if not sep or not name or not python or mode not in MODES:
        raise argparse.ArgumentTypeError(f"not NAME=PYTHON[:daemon|embedded]: {spec!r}")
    # Absolute, as given: a virtual environment's interpreter is a link not to follow.
    return Build(name, os.path.abspath(python), mode)


def parse_shape(text: str) -> tuple[int, int]:
    replies, _, calls = text.partition("x")
    if not replies.isdigit() or not calls.isdigit() or int(replies) < 1 or int(calls) < 1:
        raise argparse.ArgumentTypeError(f"not REPLIESxCALLS: {text!r}")
    return int(replies), int(calls)


def add_shape(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape", type=parse_shape, help="REPLIESxCALLS (default 63x16, quick 1x1)"
    )


def default_shape(args: argparse.Namespace) -> None:
    """Set ``args.shape`` if ``--shape`` was not given."""
    if args.shape is None:
        args.shape = (1, 1) if args.quick else (63, 16)


async def main(args: argparse.Namespace) -> None:
    builds: list[Build] = args.builds
    replies, calls = args.shape
    print(
        f"== ab_activity: {replies} x {calls}, chunk delay {args.chunk_delay} s, "
        f"{args.pairs} pairs, turns alternating"
    )
    async with contextlib.AsyncExitStack() as stack:
        running: list[tuple[Build, ServiceProcess, FakeProvider, psutil.Process]] = []
        for build in builds:
            env, place = MODES[build.mode]
            fake = await stack.enter_async_context(FakeProvider.running())
            ws = stack.enter_context(place())
            populate_project(ws.project)
            write_provider_settings(ws.home, fake.base_url)
            service = await stack.enter_async_context(running_service(ws, env, python=build.python))
            await warm_up(service, fake)
            running.append((build, service, fake, service_processes(service, ws, build.mode)[-1]))
        # A project's directories are usually older than the racy window (see bench_activity).
        await outwait_racy_window(args.quick)
        for pair in range(args.pairs):
            for build, service, fake, loop_owner in running[:: 1 if pair % 2 == 0 else -1]:
                rate, cpu = await measured_turn(
                    service, fake, loop_owner, replies, calls, args.chunk_delay
                )
                build.rates.append(rate)
                build.loop_cpu.append(cpu)
    first = builds[0]
    for build in builds:
        print(
            f"   {build.name} ({build.mode}): {statistics.median(build.rates):,.0f} events/s, "
            f"loop CPU {statistics.median(build.loop_cpu) * 1e3:.0f} ms a turn (medians)"
        )
    for build in builds[1:]:
        for label, mine, theirs in (
            ("events/s", build.rates, first.rates),
            ("loop CPU", build.loop_cpu, first.loop_cpu),
        ):
            # (Outside Linux thread CPU is counted in clock ticks: a short turn may show none.)
            ratios = [a / b for a, b in zip(mine, theirs, strict=True) if b > 0]
            if not ratios:
                print(f"   {build.name} / {first.name}, {label}: too few turns to compare")
                continue
            low, middle, high = quartiles(ratios)
            print(
                f"   {build.name} / {first.name}, {label}: median ratio "
                f"{middle:.3f} (quartiles {low:.3f} .. {high:.3f})"
            )


def arguments() -> argparse.Namespace:
    parser = argument_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--pairs", type=int, help="turns per build (default 40, quick 1)")
    add_shape(parser)
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds before each SSE chunk (default 0)"
    )
    parser.add_argument("builds", nargs="+", type=parse_spec, metavar="SPEC")
    args = parser.parse_args()
    if args.pairs is None:
        args.pairs = 1 if args.quick else 40
    default_shape(args)
    if len(args.builds) < 2 or args.pairs < 1:
        parser.error("give two SPECs or more and --pairs 1 or more")
    return args


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "", arguments())
