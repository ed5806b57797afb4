"""``magi-code --app acp`` start-up and first reply, beside the v1 service's figures.

Every sample is a new process (interpreter start and imports included):

- spawn -> ``initialize`` answer: ACP embedded (``MC_SERVICE_MODE=embedded``), ACP
  through a warm daemon (started by ``magi-code daemon start`` beforehand); and the v1
  service (``--app service``) the same two ways, for comparison.
- ``session/prompt`` written -> first ``agent_message_chunk`` read, on a session made by
  ``session/new`` right after ``initialize``; beside it the v1 ``turn.start`` -> first
  ``turn.assistant_delta`` of a process just initialized.

The editor side is plain JSON-RPC lines (no SDK), so the figures are the agent's. Medians
of 7 samples (one with ``--quick``); the loopback fake provider streams 50 deltas a turn.

    .venv/bin/python benchmarks/bench_acp.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson
from bench_startup import first_delta, samples_count, spawn
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    FakeProvider,
    Workspace,
    daemon_command,
    daemon_workspace,
    figure,
    heading,
    median,
    run_with_daemons,
    stop_service,
    workspace,
    write_provider_settings,
)
from tests.support.service import service_env

STEP_TIMEOUT = 60.0
TURN_DELTAS = 50


class AcpProcess:
    """``magi-code --app acp`` with a line-at-a-time JSON-RPC editor side."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0

    @classmethod
    async def start(cls, ws: Workspace, env: Mapping[str, str]) -> AcpProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "magi_code",
            "--app",
            "acp",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=ws.project,
            env=service_env(ws.home, env),
            limit=1 << 20,
        )
        return cls(proc)

    async def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(orjson.dumps(message) + b"\n")
        await self.proc.stdin.drain()
        return self.next_id

    async def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), STEP_TIMEOUT)
        if not line:
            raise RuntimeError("the ACP agent exited")
        message: dict[str, Any] = orjson.loads(line)
        return message

    async def answer(self, request_id: int) -> dict[str, Any]:
        while True:
            message = await self.recv()
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"ACP error: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    async def stop(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), STEP_TIMEOUT)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def acp_sample(
    ws: Workspace, env: Mapping[str, str], fake: FakeProvider
) -> tuple[float, float]:
    """(spawn -> initialize answer, prompt -> first agent_message_chunk) in seconds."""
    start = time.perf_counter()
    agent = await AcpProcess.start(ws, env)
    try:
        await agent.answer(await agent.send("initialize", {"protocolVersion": 1}))
        init = time.perf_counter() - start
        new = await agent.send("session/new", {"cwd": str(ws.project), "mcpServers": []})
        session_id = (await agent.answer(new))["sessionId"]
        await fake.enqueue({"kind": "fast", "count": TURN_DELTAS})
        start = time.perf_counter()
        prompt = await agent.send(
            "session/prompt",
            {"sessionId": session_id, "prompt": [{"type": "text", "text": "Say something."}]},
        )
        chunk: float | None = None
        while True:
            message = await agent.recv()
            if chunk is None and message.get("method") == "session/update":
                if message["params"]["update"]["sessionUpdate"] == "agent_message_chunk":
                    chunk = time.perf_counter() - start
            elif message.get("id") == prompt:
                if message.get("result", {}).get("stopReason") != "end_turn":
                    raise RuntimeError(f"the prompt ended {message}")
                break
        if chunk is None:
            raise RuntimeError("the prompt produced no agent_message_chunk")
        return init, chunk
    finally:
        await agent.stop()


async def v1_sample(
    ws: Workspace, env: Mapping[str, str], fake: FakeProvider
) -> tuple[float, float]:
    service, init = await spawn(ws, env)
    try:
        return init, await first_delta(service, fake)
    finally:
        await stop_service(service)


def report(label: str, samples: list[tuple[float, float]], what: tuple[str, str]) -> None:
    n = len(samples)
    figure(f"{label}: {what[0]}, median of {n}", median([s[0] for s in samples]) * 1e3, "ms")
    figure(f"{label}: {what[1]}", median([s[1] for s in samples]) * 1e3, "ms")


ACP_WHAT = ("spawn -> initialize", "prompt -> first agent_message_chunk")
V1_WHAT = ("spawn -> initialize", "turn.start -> first assistant delta")


async def main(args: argparse.Namespace) -> None:
    heading("bench_acp: ACP start-up and first reply, beside v1", args.quick)
    n = samples_count(args)
    async with FakeProvider.running() as fake:
        with workspace() as ws:
            write_provider_settings(ws.home, fake.base_url)
            report(
                "ACP embedded",
                [await acp_sample(ws, EMBEDDED_ENV, fake) for _ in range(n)],
                ACP_WHAT,
            )
            report(
                "v1 embedded", [await v1_sample(ws, EMBEDDED_ENV, fake) for _ in range(n)], V1_WHAT
            )
        with daemon_workspace() as ws:
            write_provider_settings(ws.home, fake.base_url)
            await daemon_command(ws, "start")
            acp = [await acp_sample(ws, DAEMON_ENV, fake) for _ in range(n)]
            v1 = [await v1_sample(ws, DAEMON_ENV, fake) for _ in range(n)]
            report("ACP warm daemon", acp, ACP_WHAT)
            report("v1 shim, warm daemon", v1, V1_WHAT)


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "")
