"""``bench_activity.py``'s tool-heavy turn back to back for a while in one mode: how its
rate spreads over this machine's phases.

    .venv/bin/python benchmarks/window_activity.py [--quick] [--seconds S]
                                                    [--mode daemon|embedded] [--shape RxC]

The same turn takes up to twice the CPU in this machine's slow phases (other load on the
host, which nothing inside the machine shows: not steal time, not a fixed loop timed
beside it), so a few turns give the phase, not the service. Printed: the turns' median
activity events/s with quartiles, the median of each minute, the median event-loop CPU
a turn, and the median rate of the turns whose loop CPU was in the lowest quartile: those
the machine ran at its quietest (the same work cost the least), the figure a quiet
machine gives.

``--quick`` is a smoke run: one 1x1 turn (unless ``--seconds`` or ``--shape`` say
otherwise), without first waiting out the racy window; its figures are not meaningful.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ab_activity import MODES, add_shape, default_shape
from bench_activity import measured_turn, populate_project, service_processes, warm_up
from benchlib import (
    FakeProvider,
    argument_parser,
    outwait_racy_window,
    run_with_daemons,
    running_service,
    write_provider_settings,
)


async def main(args: argparse.Namespace) -> None:
    replies, calls = args.shape
    print(f"== window_activity: {replies} x {calls}, {args.mode}, {args.seconds:g} s of turns")
    env, place = MODES[args.mode]
    turns: list[tuple[float, float, float]] = []  # (start, events/s, loop CPU seconds)
    async with FakeProvider.running() as fake:
        with place() as ws:
            populate_project(ws.project)
            write_provider_settings(ws.home, fake.base_url)
            async with running_service(ws, env) as service:
                await warm_up(service, fake)
                loop_owner = service_processes(service, ws, args.mode)[-1]
                # A project's directories are usually older than the racy window.
                await outwait_racy_window(args.quick)
                start = time.monotonic()
                while not turns or time.monotonic() - start < args.seconds:
                    began = time.monotonic() - start
                    rate, cpu = await measured_turn(service, fake, loop_owner, replies, calls)
                    turns.append((began, rate, cpu))
    rates = [rate for _, rate, _ in turns]
    print(f"   turns: {len(turns)}")
    if len(turns) < 4:
        print(f"   activity events/s, median: {statistics.median(rates):,.0f}")
        return
    low, middle, high = statistics.quantiles(rates, n=4)
    print(f"   activity events/s, median: {middle:,.0f} (quartiles {low:,.0f} .. {high:,.0f})")
    for minute in range(int(turns[-1][0] // 60) + 1):
        those = [rate for began, rate, _ in turns if began // 60 == minute]
        print(f"   minute {minute + 1}: {statistics.median(those):,.0f} /s ({len(those)} turns)")
    cpus = [cpu for _, _, cpu in turns]
    print(f"   event-loop CPU a turn, median: {statistics.median(cpus) * 1e3:.0f} ms")
    quiet_cpu = statistics.quantiles(cpus, n=4)[0]
    quiet = [rate for _, rate, cpu in turns if cpu <= quiet_cpu]
    print(
        f"   activity events/s, median of the turns with the least loop CPU (<= "
        f"{quiet_cpu * 1e3:.0f} ms, {len(quiet)} turns): {statistics.median(quiet):,.0f}"
    )


def arguments() -> argparse.Namespace:
    parser = argument_parser(__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, help="default 240, quick 0 (one turn)")
    parser.add_argument("--mode", choices=sorted(MODES), default="daemon")
    add_shape(parser)
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 0.0 if args.quick else 240.0
    default_shape(args)
    return args


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "", arguments())
