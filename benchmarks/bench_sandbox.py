"""What the ``workspace_write`` sandbox adds to a shell tool call (issue #33 item 4).

Figures: the latency of one shell tool call running ``true``, through the real tool code
path (``Shell.run`` with a ``ToolContext``: the stripped environment, the project
directory, the umask wrapper, the process-group cleanup), unconfined and under bubblewrap
with the turn's sandbox (``turns.runtime.turn_sandbox``); median and p95 of each, and the
difference of the medians. Calls alternate between the two, so load on the machine
affects both alike. The one-time ``bwrap`` probe is timed separately.

    .venv/bin/python benchmarks/bench_sandbox.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchlib import figure, heading, median, percentile, run, workspace

from magi_code.config.settings import build_settings
from magi_code.storage.launch import LaunchContext
from magi_code.tools.base import ToolContext
from magi_code.tools.sandbox import bubblewrap
from magi_code.tools.shell import Shell
from magi_code.turns.runtime import turn_sandbox


async def timed_call(tool: Shell, ctx: ToolContext) -> float:
    start = time.perf_counter()
    outcome = await tool.run({"command": "true"}, ctx)
    elapsed = time.perf_counter() - start
    if outcome.is_error:
        raise SystemExit(f"the shell call failed: {outcome.output}")
    return elapsed


async def main(args: argparse.Namespace) -> None:
    heading("sandbox: shell tool call latency, unconfined vs workspace_write", args.quick)
    start = time.perf_counter()
    found = bubblewrap()
    probe_ms = (time.perf_counter() - start) * 1000
    if found.path is None:
        print(f"   no usable sandbox here ({found.problem}): nothing to compare")
        return
    figure("bwrap probe, once per process", probe_ms, "ms")
    calls = 5 if args.quick else 200
    with workspace() as ws:
        env = {**os.environ, "MC_HOME": str(ws.home)}
        launch = LaunchContext(ws.home, ws.project, env)
        settings = build_settings({"sandbox": "workspace_write"}, {})
        sandbox = turn_sandbox(launch, settings)
        plain = ToolContext(project_dir=ws.project, env=env)
        confined = ToolContext(project_dir=ws.project, env=env, sandbox=sandbox)
        tool = Shell()
        for ctx in (plain, confined):  # warm: the first spawn loads what it needs
            await timed_call(tool, ctx)
        times: dict[str, list[float]] = {"none": [], "workspace_write": []}
        for _ in range(calls):
            times["none"].append(await timed_call(tool, plain))
            times["workspace_write"].append(await timed_call(tool, confined))
    for level, values in times.items():
        ms = [value * 1000 for value in values]
        figure(f"shell call `true`, sandbox {level}, median", median(ms), "ms")
        figure(f"shell call `true`, sandbox {level}, p95", percentile(ms, 95), "ms")
    extra = median(times["workspace_write"]) - median(times["none"])
    figure("added by the sandbox, median", extra * 1000, "ms")
    print(json.dumps({"calls": calls, "bwrap": os.path.basename(found.path)}), file=sys.stderr)


if __name__ == "__main__":
    run(main, __doc__ or "")
