"""Structured activity and the tool loop through the real stdio process (issue 8).

Figures: ``turn.activity`` events/s (and drops) for a tool-heavy scripted turn (many
``list_files`` calls per provider reply, over many replies), embedded and through the
shim to a daemon, and for the same calls in 7 times fewer replies; the CPU time the
service's processes (and the fake provider) spent on each turn, and the events per
CPU-second of the service; the CPU of the event-loop thread that runs the turn (the
embedded service's, or the daemon's) and the events per second of it, the rate with a
provider that cost nothing, since the turn's loop and the provider take turns; and the
tool loop's cost per iteration (embedded): the time of a turn with K provider round
trips that each make one cheap tool call, minus the time of a turn without tools,
divided by K; the daemon's idle RSS before and after the tool-heavy turns; and,
in-process, what building and encoding the request bodies of the tool-heavy turn costs
per wire API, with and without the agent's message cache, and what one reply of that turn
costs to read, through ``stream_response`` and through the service's HTTP client alone.

    .venv/bin/python benchmarks/bench_activity.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    FakeProvider,
    ServiceProcess,
    Workspace,
    daemon_process,
    daemon_workspace,
    figure,
    heading,
    median,
    outwait_racy_window,
    rss_bytes,
    run_with_daemons,
    running_service,
    workspace,
    write_provider_settings,
)

from magi_code.daemon.heap import TRIM_INTERVAL_SECONDS
from magi_code.providers import (
    API_KINDS,
    ConversationItem,
    Endpoint,
    MessageCache,
    ProviderRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserText,
    build_call,
)
from magi_code.providers.http import DIRECT, build_client
from magi_code.providers.stream import stream_response
from magi_code.tools.files import ListFiles
from magi_code.turns.agent import MAX_PROVIDER_REQUESTS

LIST_ARGUMENTS = orjson.dumps({"pattern": "**/*.py"}).decode()


def tool_reply(calls: int, round_no: int, chunk_delay: float = 0.0) -> dict[str, Any]:
    """A reply of ``calls`` ``list_files`` calls. With a ``chunk_delay``, a provider that
    paces its stream: the calls follow :data:`PACED_CHUNKS` one-character text chunks,
    each sent ``chunk_delay`` seconds after the one before."""
    tool_calls = [
        {"call_id": f"call-{round_no}-{i}", "name": "list_files", "arguments": LIST_ARGUMENTS}
        for i in range(calls)
    ]
    text = ["."] * PACED_CHUNKS if chunk_delay else []
    return {"text": text, "tool_calls": tool_calls, "chunk_delay": chunk_delay}


FINAL_REPLY = {"text": ["Done."]}
PACED_CHUNKS = 50


async def timed_turn(service: ServiceProcess) -> tuple[float, dict[str, int]]:
    """Run one turn in a new session (so history and context do not grow between turns);
    returns (start -> terminal seconds, counts of what arrived)."""
    request_id = service.next_id("turn")
    start = time.perf_counter()
    await service.send(
        {
            "protocol_version": 1,
            "kind": "request",
            "request_id": request_id,
            "method": "turn.start",
            "payload": {"prompt": "List the Python files.", "options": {}},
        }
    )
    counts = {"activity": 0, "delta": 0, "dropped": 0}
    while True:
        message = await service.recv()
        if message["kind"] == "response":
            if message["error"] is not None:
                raise RuntimeError(f"turn.start failed: {message['error']}")
            continue
        if message["event"] == "turn.activity":
            counts["activity"] += 1
        elif message["event"] == "turn.assistant_delta":
            counts["delta"] += 1
        elif message["event"] == "turn.terminal":
            elapsed = time.perf_counter() - start
            payload = message["payload"]
            if payload["status"] != "completed":
                raise RuntimeError(f"turn ended {payload['status']}")
            counts["dropped"] = payload["activity_dropped"]
            return elapsed, counts


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def loop_cpu_seconds(process: psutil.Process) -> float:
    """CPU of ``process``'s main thread: its event loop, which runs the whole turn. Linux
    counts it in nanoseconds (``schedstat``); elsewhere psutil's clock ticks (10 ms) do."""
    schedstat = f"/proc/{process.pid}/task/{process.pid}/schedstat"
    with contextlib.suppress(OSError, ValueError, IndexError), open(schedstat) as stat:
        return int(stat.read().split()[0]) / 1e9
    for thread in process.threads():
        if thread.id == process.pid:
            return float(thread.user_time + thread.system_time)
    raise RuntimeError("the service's main thread is gone")


async def activity_rate(
    service: ServiceProcess,
    fake: FakeProvider,
    turns: int,
    rounds: int,
    mode: str,
    service_processes: list[psutil.Process],
    calls: int = 16,
) -> None:
    rates: list[float] = []
    service_cpu: list[float] = []
    fake_cpu: list[float] = []
    per_cpu_second: list[float] = []
    loop_cpu: list[float] = []
    per_loop_second: list[float] = []
    delivered = dropped = 0
    provider = psutil.Process(fake.proc.pid)
    turn_process = service_processes[-1]  # the embedded service, or the daemon
    for _ in range(turns):
        await fake.enqueue(*(tool_reply(calls, r) for r in range(rounds)), FINAL_REPLY)
        before = cpu_seconds(service_processes), cpu_seconds([provider])
        loop_before = loop_cpu_seconds(turn_process)
        elapsed, counts = await timed_turn(service)
        used = cpu_seconds(service_processes) - before[0]
        loop_used = loop_cpu_seconds(turn_process) - loop_before
        loop_cpu.append(loop_used)
        per_loop_second.append(counts["activity"] / loop_used if loop_used else float("inf"))
        rates.append(counts["activity"] / elapsed)
        service_cpu.append(used)
        fake_cpu.append(cpu_seconds([provider]) - before[1])
        per_cpu_second.append(counts["activity"] / used if used else float("inf"))
        delivered += counts["activity"]
        dropped += counts["dropped"]
    figure(
        f"activity events/s, {rounds} replies x {calls} list_files, {mode}",
        median(rates),
        "events/s",
    )
    figure(f"  activity events per turn (delivered, {turns} turns)", delivered // turns, "events")
    figure("  activity dropped per turn (queue full)", dropped // turns, "events")
    figure("  service CPU per turn (user + sys)", median(service_cpu) * 1e3, "ms")
    figure("  fake provider CPU per turn", median(fake_cpu) * 1e3, "ms")
    figure("  activity events per service CPU-second", median(per_cpu_second), "events/s")
    figure("  event-loop thread CPU per turn", median(loop_cpu) * 1e3, "ms")
    figure("  activity events per event-loop CPU-second", median(per_loop_second), "events/s")


async def measured_turn(
    service: ServiceProcess,
    fake: FakeProvider,
    loop_owner: psutil.Process,
    replies: int,
    calls: int,
    chunk_delay: float = 0.0,
) -> tuple[float, float]:
    """One tool-heavy turn (``replies`` replies of ``calls`` ``list_files`` calls, then the
    final text): its activity events/s and the CPU of ``loop_owner``'s event loop."""
    replies_sent = (tool_reply(calls, r, chunk_delay) for r in range(replies))
    await fake.enqueue(*replies_sent, FINAL_REPLY)
    before = loop_cpu_seconds(loop_owner)
    elapsed, counts = await timed_turn(service)
    return counts["activity"] / elapsed, loop_cpu_seconds(loop_owner) - before


def service_processes(service: ServiceProcess, ws: Workspace, mode: str) -> list[psutil.Process]:
    """The processes doing a turn's work: the service itself, and in daemon mode the daemon."""
    found = [psutil.Process(service.proc.pid)]
    if mode == "daemon":
        found.append(daemon_process(ws))
    return found


async def tool_loop_overhead(
    service: ServiceProcess, fake: FakeProvider, repeats: int, rounds: int
) -> None:
    plain: list[float] = []
    looped: list[float] = []
    for _ in range(repeats):
        await fake.enqueue(FINAL_REPLY)
        plain.append((await timed_turn(service))[0])
        await fake.enqueue(*(tool_reply(1, r) for r in range(rounds)), FINAL_REPLY)
        looped.append((await timed_turn(service))[0])
    no_tools = median(plain)
    with_tools = median(looped)
    figure(f"turn without tools, median of {repeats}", no_tools * 1e3, "ms")
    figure(f"turn with {rounds} one-tool round trips, median", with_tools * 1e3, "ms")
    figure("tool loop cost per iteration", (with_tools - no_tools) / rounds * 1e3, "ms")


def request_bodies(rounds: int, calls: int) -> None:
    """In-process: ms to build and encode the request bodies of a tool turn shaped as the
    activity figures' (each request resends the conversation so far), per wire API, each
    request built fresh and with the agent's ``MessageCache``."""
    listing = "\n".join(f"pkg{p}/mod{m}.py" for p in range(4) for m in range(10))
    items: list[ConversationItem] = [UserText("List the Python files.")]
    conversations = []
    for round_no in range(rounds + 1):
        conversations.append(list(items))
        ids = [f"call-{round_no}-{i}" for i in range(calls)]
        items += [ToolCall(call_id, "list_files", LIST_ARGUMENTS) for call_id in ids]
        items += [ToolResult(call_id, "list_files", listing, False) for call_id in ids]
    tools = [ToolSpec(ListFiles.name, ListFiles.description, ListFiles.parameters)]
    for api in API_KINDS:
        endpoint = Endpoint(api, "http://127.0.0.1:1")
        for label, cache in (
            ("built fresh", None),
            ("message cache", MessageCache()),
        ):
            start = time.perf_counter()
            for conversation in conversations:
                request = ProviderRequest(
                    "m",
                    "You are a test.",
                    conversation,
                    tools,
                    "default",
                    False,
                    0,
                    message_cache=cache,
                )
                build_call(endpoint, request).content()
            elapsed = time.perf_counter() - start
            figure(f"{rounds + 1} request bodies, {api}, {label}", elapsed * 1e3, "ms")


async def provider_reply_cost(fake: FakeProvider, requests: int, calls: int = 16) -> None:
    """In-process: the CPU of one provider request whose reply streams ``calls`` tool calls
    (Chat Completions, one HTTP chunk per SSE frame, as providers send them), read through
    ``stream_response`` and through the service's HTTP client alone: the provider's share of
    each reply of the tool-heavy turn, and the HTTP client's share of that."""
    endpoint = Endpoint("openai-chat", f"{fake.base_url}/v1")
    request = ProviderRequest(
        "m", "You are a test.", [UserText("List the Python files.")], [], "default", False, 0
    )
    call = build_call(endpoint, request)
    body = orjson.dumps(call.body)
    async with build_client(DIRECT) as client:

        async def decoded() -> None:
            async for _ in stream_response(client, endpoint, request):
                pass

        async def http_only() -> None:
            headers = dict(call.headers)
            async with client.stream("POST", call.url, content=body, headers=headers) as reply:
                async for _ in reply.aiter_bytes():
                    pass

        for label, read in (("stream_response", decoded), ("HTTP alone", http_only)):
            await fake.enqueue(*(tool_reply(calls, r) for r in range(requests + 1)))
            await read()  # the connection and first-use imports are not part of the figure
            start = time.thread_time()
            for _ in range(requests):
                await read()
            cpu = (time.thread_time() - start) / requests
            figure(f"a reply of {calls} tool calls, {label}, CPU per request", cpu * 1e3, "ms")


def populate_project(project: Path) -> None:
    for package in range(4):
        directory = project / f"pkg{package}"
        directory.mkdir()
        for module in range(10):
            (directory / f"mod{module}.py").write_text("x = 1\n")


async def main(args: argparse.Namespace) -> None:
    heading("bench_activity: activity events and the tool loop", args.quick)
    # One provider request is the final answer; the rest may call tools.
    rounds = 2 if args.quick else MAX_PROVIDER_REQUESTS - 1
    turns = 1 if args.quick else 3
    request_bodies(rounds, 16)
    async with FakeProvider.running() as fake:
        await provider_reply_cost(fake, 5 if args.quick else 200)
        for mode, env, place in (
            ("embedded", EMBEDDED_ENV, workspace),
            ("daemon", DAEMON_ENV, daemon_workspace),
        ):
            with place() as ws:
                populate_project(ws.project)
                write_provider_settings(ws.home, fake.base_url)
                async with running_service(ws, env) as service:
                    await warm_up(service, fake)
                    # A project's directories are usually older than the racy window
                    # within which the file tools read a directory again on every call.
                    await outwait_racy_window(args.quick)
                    processes = service_processes(service, ws, mode)
                    idle = rss_bytes(processes[-1].pid)
                    await activity_rate(service, fake, turns, rounds, mode, processes)
                    # The same calls in 7 times fewer replies: what each provider request
                    # costs the turn, besides its calls (with more calls per reply, their
                    # events can outrun this script's reading them, sharing the 2 cores:
                    # a full turn queue, 256 events, drops activity).
                    few = max(1, rounds // 7)
                    await activity_rate(
                        service, fake, turns, few, mode, processes, calls=16 * rounds // few
                    )
                    if mode == "embedded":
                        await tool_loop_overhead(service, fake, 1 if args.quick else 5, rounds)
                    else:
                        # The daemon gives its free heap back once turns ended (daemon.heap).
                        await asyncio.sleep(0 if args.quick else TRIM_INTERVAL_SECONDS + 1)
                        figure("daemon idle RSS before these turns", idle / 2**20, "MiB")
                        after = rss_bytes(processes[-1].pid)
                        figure("daemon idle RSS after them", after / 2**20, "MiB")


async def warm_up(service: ServiceProcess, fake: FakeProvider) -> None:
    """First-use imports and connections are not part of the figures."""
    await fake.enqueue(tool_reply(1, 0), FINAL_REPLY)
    await timed_turn(service)


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "")
