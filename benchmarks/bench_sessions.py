"""Durable sessions through the real stdio process (issue 3).

Figures: paged ``session.replay`` of a ~2 MiB session (pages/s, bytes/s); ``session.list``
paging over a 20,000-entry sessions directory (the scan budget), ms per page, and the
first page after the directory changed (a full scan), each embedded and through the shim
to a daemon; in-process, a replay page of that session while a turn appends to it (a
record between pages), and what a turn's start reads of a ~2 MiB session of short turns
that compacted near its end, by a store that has not parsed it yet: taking its lease and
the turn's context (``SessionStore.load_context``), ms and the peak of traced Python
memory, then the context of the session's next turn by the same store (a turn's records
appended since); the ``session.create`` rate (each create is closed again: attachments are
capped at 16); and, in-process through ``SessionStore``, appends per second to one
session with 1 and with 16 concurrent writers (group commit: records queued during an
fsync share the next one).

    .venv/bin/python benchmarks/bench_sessions.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import tracemalloc
from pathlib import Path

import orjson
from benchlib import (
    DAEMON_ENV,
    EMBEDDED_ENV,
    ServiceProcess,
    daemon_workspace,
    figure,
    heading,
    median,
    run_with_daemons,
    running_service,
    workspace,
    write_short_turns,
)

from magi_code.protocol.limits import MAX_SESSION_LIST_SCAN_ENTRIES, MAX_SESSION_PAGE_ITEMS
from magi_code.sessions.ids import new_session_id
from magi_code.sessions.records import encode_record, now_rfc3339
from magi_code.sessions.store import SessionStore

# One turn as the runtime records it: user prompt, assistant text, terminal (which repeats
# the assistant text), so replay splits long messages into 2 KiB parts across pages.
USER_TEXT = "Please look at the module and explain it. " * 12
ASSISTANT_TEXT = "The module reads records, validates them and writes pages. " * 100


def build_session(sessions_dir: Path, target_bytes: int) -> tuple[str, int]:
    """A session of about ``target_bytes`` written through the store (fsynced appends)."""
    store = SessionStore(sessions_dir)
    session_id = store.create()
    with store.acquire_writer_lease(session_id) as lease:
        turn = 0
        while (sessions_dir / session_id / "history.jsonl").stat().st_size < target_bytes:
            turn_id = f"t{turn}"
            lease.append({"type": "user", "turn_id": turn_id, "text": USER_TEXT})
            lease.append({"type": "assistant", "turn_id": turn_id, "text": ASSISTANT_TEXT})
            lease.append(
                {
                    "type": "terminal",
                    "turn_id": turn_id,
                    "status": "completed",
                    "assistant_text": ASSISTANT_TEXT,
                }
            )
            turn += 1
    return session_id, (sessions_dir / session_id / "history.jsonl").stat().st_size


def populate_sessions(sessions_dir: Path, count: int) -> None:
    """``count`` valid session directories written directly (no fsync: only the listing
    is measured); every one gets its own header and shares one title sidecar by hard link."""
    sessions_dir.mkdir(parents=True, exist_ok=True)
    title = sessions_dir / "title.json"
    title.write_bytes(orjson.dumps({"v": 1, "title": "Benchmark session"}))
    created = now_rfc3339()
    for _ in range(count):
        session_id = new_session_id()
        directory = sessions_dir / session_id
        directory.mkdir(mode=0o700)
        header = {"type": "header", "session_id": session_id, "created_at": created}
        (directory / "history.jsonl").write_bytes(encode_record(header, 0, created))
        os.link(title, directory / "meta.json")
    title.unlink()


async def replay(
    service: ServiceProcess, session_id: str, size: int, rounds: int, mode: str
) -> None:
    timings: list[float] = []
    pages = wire = 0
    # One round unmeasured: it parses the window, and a daemon just started by the shim
    # is still loading the rest of its runtime meanwhile.
    for _ in range(rounds + 1):
        after: str | None = None
        pages = wire = 0
        start = time.perf_counter()
        while True:
            response = await service.request(
                "session.replay", {"after": after}, session_id=session_id
            )
            if response["error"] is not None:
                raise RuntimeError(f"replay failed: {response['error']}")
            page = response["payload"]
            pages += 1
            wire += len(orjson.dumps(response)) + 1
            after = page["next_cursor"]
            if not page["truncated"]:
                break
        timings.append(time.perf_counter() - start)
    best = median(timings[1:])
    figure(f"replay {size / 2**20:.2f} MiB session, {mode}: pages", pages, "pages")
    figure("  replay: pages per second", pages / best, "pages/s")
    figure("  replay: session bytes per second", size / best / 2**20, "MiB/s")
    figure("  replay: response bytes per second", wire / best / 2**20, "MiB/s")
    figure("  replay: whole session", best * 1e3, "ms")


async def listing(service: ServiceProcess, count: int, pages: int, mode: str, quick: bool) -> None:
    # The first request after the directory changed scans it; wait until a scan may be
    # kept (the directory's timestamps must be older than the racy window), unless quick.
    await asyncio.sleep(0 if quick else 0.2)
    start = time.perf_counter()
    response = await service.request("session.list", {"after": None})
    figure(
        f"session.list, {mode}: first page (scans the directory)",
        (time.perf_counter() - start) * 1e3,
        "ms",
    )
    samples: list[float] = []
    after: str | None = None
    seen = 0
    for _ in range(pages):
        start = time.perf_counter()
        response = await service.request("session.list", {"after": after})
        samples.append(time.perf_counter() - start)
        if response["error"] is not None:
            raise RuntimeError(f"list failed: {response['error']}")
        page = response["payload"]
        seen += len(page["sessions"])
        after = page["next_after"]
        if after is None:
            break
    per_page = median(samples)
    figure(f"  session.list over {count:,} sessions, median/page", per_page * 1e3, "ms")
    figure(
        f"  whole list ({-(-count // MAX_SESSION_PAGE_ITEMS)} pages), extrapolated",
        per_page * -(-count // MAX_SESSION_PAGE_ITEMS),
        "s",
    )


async def creates(service: ServiceProcess, count: int) -> None:
    create_times: list[float] = []
    close_times: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        created = await service.request("session.create")
        create_times.append(time.perf_counter() - start)
        if created["error"] is not None:
            raise RuntimeError(f"create failed: {created['error']}")
        session_id = created["payload"]["session_id"]
        start = time.perf_counter()
        closed = await service.request("session.close", session_id=session_id)
        close_times.append(time.perf_counter() - start)
        if closed["error"] is not None:
            raise RuntimeError(f"close failed: {closed['error']}")
    figure("session.create rate", count / sum(create_times), "creates/s")
    figure("  session.create latency, median", median(create_times) * 1e3, "ms")
    figure("  session.close latency, median", median(close_times) * 1e3, "ms")


def replay_while_appending(sessions_dir: Path, session_id: str, pages: int) -> None:
    """ms per ``SessionStore.replay`` page when each page follows an append, as while a
    turn runs."""
    store = SessionStore(sessions_dir)
    timings: list[float] = []
    after: object = None
    with store.acquire_writer_lease(session_id) as lease:
        for index in range(pages + 1):
            lease.append({"type": "user", "turn_id": "growing", "text": f"prompt {index}"})
            start = time.perf_counter()
            page = store.replay(session_id, after, 20)
            timings.append(time.perf_counter() - start)
            after = page["next_cursor"] if page["truncated"] else None
    # The first page parses the whole window, as any first replay does.
    figure("replay page after each append, in-process", median(timings[1:]) * 1e3, "ms")


def short_turns_session(sessions_dir: Path, target_bytes: int) -> str:
    """A session of about ``target_bytes`` of short turns (a prompt, a reply, its
    terminal: ~150 bytes a record), written straight to its history (not fsynced), then
    compacted through the store: a checkpoint keeping only its last prompt."""
    store = SessionStore(sessions_dir)
    session_id = store.create()
    write_short_turns(sessions_dir / session_id / "history.jsonl", target_bytes)
    with store.acquire_writer_lease(session_id) as lease:
        prompt = lease.append({"type": "user", "turn_id": "compacted", "text": "go on"})
        lease.append({"type": "compaction", "summary": "so far", "cutoff_seq": prompt - 1})
    return session_id


def turn_start_reads(sessions_dir: Path, runs: int) -> None:
    """What a turn's start reads of a long compacted session whose window is not cached
    (a client attached, or the window was evicted), each run by a fresh store: taking the
    lease (it closes a turn a crash left open) and the turn's context."""
    session_id = short_turns_session(sessions_dir, 2000 * 1024)

    def attach() -> None:
        store = SessionStore(sessions_dir)
        with store.acquire_writer_lease(session_id) as lease:
            store.close_last_interrupted_turn(lease)

    def context() -> None:
        SessionStore(sessions_dir).load_context(session_id)

    for label, step in (("lease taken", attach), ("context", context)):
        timings: list[float] = []
        for _ in range(runs):
            start = time.perf_counter()
            step()
            timings.append(time.perf_counter() - start)
        tracemalloc.start()
        step()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        figure(f"2 MiB compacted session, uncached: {label}", median(timings) * 1e3, "ms")
        figure("  its peak traced memory", peak / 2**20, "MiB")
    # A session's next turn, by the store that loaded the last one's context: a turn's
    # records appended between the two.
    store = SessionStore(sessions_dir)
    store.load_context(session_id)
    timings = []
    with store.acquire_writer_lease(session_id) as lease:
        for n in range(runs):
            lease.append({"type": "user", "turn_id": f"next{n}", "text": "and then?"})
            lease.append({"type": "assistant", "turn_id": f"next{n}", "text": "this."})
            start = time.perf_counter()
            store.load_context(session_id)
            timings.append(time.perf_counter() - start)
    figure("2 MiB compacted session: the next turn's context", median(timings) * 1e3, "ms")


async def appends(sessions_dir: Path, writers: int, per_writer: int) -> float:
    """Records/s appended to one session by ``writers`` tasks, each awaiting every record."""
    store = SessionStore(sessions_dir)
    session_id = store.create()
    lease = store.acquire_writer_lease(session_id)

    async def writer(name: str) -> None:
        for index in range(per_writer):
            call = {
                "type": "tool_call",
                "turn_id": name,
                "call_id": f"{name}-{index}",
                "name": "list_files",
                "arguments": '{"pattern":"**/*.py"}',
            }
            await lease.append_async(call)

    start = time.perf_counter()
    await asyncio.gather(*(writer(f"w{i}") for i in range(writers)))
    elapsed = time.perf_counter() - start
    batches = lease.batches
    await asyncio.to_thread(lease.release)
    rate = writers * per_writer / elapsed
    figure(
        f"appends/s, {writers} writer(s) awaiting each record",
        rate,
        f"records/s ({writers * per_writer / batches:.1f} per fsync)",
    )
    return rate


async def main(args: argparse.Namespace) -> None:
    heading("bench_sessions: durable session operations", args.quick)
    with workspace() as ws:
        sessions_dir = ws.home / "sessions"
        start = time.perf_counter()
        session_id, size = build_session(sessions_dir, (64 if args.quick else 2000) * 1024)
        build = time.perf_counter() - start
        figure("  (setup) build session through SessionStore", build * 1e3, "ms")
        async with running_service(ws, EMBEDDED_ENV) as service:
            await replay(service, session_id, size, 1 if args.quick else 7, "embedded")
            await creates(service, 5 if args.quick else 200)
        replay_while_appending(sessions_dir, session_id, 5 if args.quick else 200)
        turn_start_reads(sessions_dir, 3 if args.quick else 21)
    with daemon_workspace() as ws:
        session_id, size = build_session(ws.home / "sessions", (64 if args.quick else 2000) * 1024)
        async with running_service(ws, DAEMON_ENV) as service:
            await replay(service, session_id, size, 1 if args.quick else 7, "through the shim")
    count = 100 if args.quick else MAX_SESSION_LIST_SCAN_ENTRIES
    for mode, env, place in (
        ("embedded", EMBEDDED_ENV, workspace),
        ("through the shim", DAEMON_ENV, daemon_workspace),
    ):
        with place() as ws:
            start = time.perf_counter()
            populate_sessions(ws.home / "sessions", count)
            figure("  (setup) write session directories", time.perf_counter() - start, "s")
            async with running_service(ws, env) as service:
                await listing(service, count, 4 if args.quick else 40, mode, args.quick)
    with workspace() as ws:
        records = 32 if args.quick else 1000
        await appends(ws.home / "sessions", 1, records)
        await appends(ws.home / "sessions", 16, records // 16)


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "")
