"""Fork and rewind (RFC-0002 §6.16) of a session whose last turn changed 100 files.

Through a daemon (a persistent client, the fake provider making the agent's 100
``write_file`` calls of 4 KiB files, each checkpointed): the turn itself, then the rewind
preview, the commit (100 files restored, the ``rewind`` record appended) and a fork at
the same point, ms each. In-process through ``SessionStore`` (no protocol, the files and
history written directly): preview and commit of 100 and of 1,000 changed files.
With ``--quick``: 10 changed files, one sample each, and not the 1,000.

    .venv/bin/python benchmarks/bench_rewind.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchlib import (
    FakeProvider,
    daemon_launch_context,
    daemon_workspace,
    figure,
    heading,
    median,
    run_with_daemons,
    workspace,
    write_provider_settings,
)

from magi_code.client import Client
from magi_code.sessions.checkpoints import Checkpoints, digest
from magi_code.sessions.rewind import commit_rewind, plan_rewind
from magi_code.sessions.store import SessionStore

FILES = 100
FILE_BYTES = 4096
STEP_TIMEOUT = 120.0


def _content(name: str, version: str) -> str:
    line = f"{name} {version} " * 8
    return (line + "\n") * (FILE_BYTES // (len(line) + 1))


async def _turn(client: Client, prompt: str, session_id: str | None) -> str:
    reply = await client.request("turn.start", {"prompt": prompt}, session_id=session_id)
    if reply["error"] is not None:
        raise RuntimeError(f"turn.start failed: {reply['error']}")
    async for event in client.events():
        if isinstance(event, dict) and event.get("event") == "turn.terminal":
            if event["payload"]["status"] != "completed":
                raise RuntimeError(f"the turn ended {event['payload']['status']}")
            break
    return str(reply["payload"]["session_id"])


async def _terminal_cursors(client: Client, session_id: str) -> list[str]:
    cursors, after = [], None
    while True:
        reply = await client.request("session.replay", {"after": after}, session_id=session_id)
        page = reply["payload"]
        cursors += [i["cursor"] for i in page["events"] if i["kind"] == "terminal"]
        after = page["next_cursor"]
        if not page["truncated"]:
            return cursors


async def through_the_daemon(files: int, repeats: int) -> None:
    times: dict[str, list[float]] = {"turn": [], "preview": [], "commit": [], "fork": []}
    async with FakeProvider.running() as fake:
        for _ in range(repeats):
            with daemon_workspace() as ws:
                write_provider_settings(ws.home, fake.base_url)
                names = [f"src/file{i:03}.txt" for i in range(files)]
                for name in names:
                    (ws.project / name).parent.mkdir(exist_ok=True)
                    (ws.project / name).write_text(_content(name, "before"))
                calls = [
                    {
                        "call_id": f"w{i}",
                        "name": "write_file",
                        "arguments": json.dumps({"path": name, "content": _content(name, "agent")}),
                    }
                    for i, name in enumerate(names)
                ]
                await fake.enqueue(
                    {"text": ["ok"]}, {"text": [], "tool_calls": calls}, {"text": ["done"]}
                )
                client = await Client.connect(daemon_launch_context(ws), client_name="bench")
                try:
                    await client.request("initialize", {"supported_protocol_versions": [1]})
                    session_id = await _turn(client, "first", None)
                    began = time.perf_counter()
                    await _turn(client, "change every file", session_id)
                    times["turn"].append(time.perf_counter() - began)
                    cursor = (await _terminal_cursors(client, session_id))[0]
                    began = time.perf_counter()
                    preview = await client.rewind_session(session_id, cursor)
                    times["preview"].append(time.perf_counter() - began)
                    if preview["file_states"] != {"restore": files}:
                        raise RuntimeError(f"unexpected preview: {preview['file_states']}")
                    began = time.perf_counter()
                    await client.fork_session(session_id, cursor)
                    times["fork"].append(time.perf_counter() - began)
                    began = time.perf_counter()
                    done = await client.rewind_session(session_id, cursor, commit=True)
                    times["commit"].append(time.perf_counter() - began)
                    if done["file_states"] != {"restored": files}:
                        raise RuntimeError(f"unexpected commit: {done['file_states']}")
                    if (ws.project / names[0]).read_text() != _content(names[0], "before"):
                        raise RuntimeError("a file was not restored")
                finally:
                    await client.close()
    figure(
        f"daemon: turn of {files} write_file calls (checkpointed)",
        median(times["turn"]) * 1e3,
        "ms",
    )
    figure(f"daemon: rewind preview, {files} files", median(times["preview"]) * 1e3, "ms")
    figure(f"daemon: rewind commit, {files} files restored", median(times["commit"]) * 1e3, "ms")
    figure("daemon: fork at the same point", median(times["fork"]) * 1e3, "ms")


def _session_with_changes(root: Path, files: int) -> tuple[SessionStore, str, str]:
    """A session of two turns, the second changing ``files`` files (on disk as the agent
    left them, their old content kept); the cursor after the first turn."""
    project = root / "changed"
    project.mkdir(parents=True)
    store = SessionStore(root / "sessions")
    session_id = store.create(project)
    blobs = Checkpoints(store.session_dir(session_id))
    with store.acquire_writer_lease(session_id) as lease:
        for turn_id in ("t1", "t2"):
            lease.append({"type": "user", "turn_id": turn_id, "text": f"turn {turn_id}"})
            if turn_id == "t2":
                for i in range(files):
                    name = f"file{i:04}.txt"
                    before = _content(name, "before").encode()
                    after = _content(name, "agent").encode()
                    blobs.save(before)
                    (project / name).write_bytes(after)
                    change: dict[str, Any] = {
                        "type": "file_change",
                        "turn_id": turn_id,
                        "root": str(project.resolve()),
                        "path": name,
                        "before": digest(before),
                        "after": digest(after),
                    }
                    lease.append(change)
            done = {"type": "terminal", "turn_id": turn_id, "status": "completed"}
            lease.append({**done, "assistant_text": ""})
    page = store.replay(session_id, None, 32)
    events: list[dict[str, Any]] = page["events"]  # type: ignore[assignment]
    cursor = next(str(i["cursor"]) for i in events if i["kind"] == "terminal")
    return store, session_id, cursor


def in_process(files: int, repeats: int) -> None:
    previews, commits = [], []
    for _ in range(repeats):
        with workspace() as ws:
            store, session_id, cursor = _session_with_changes(ws.root / "store", files)
            began = time.perf_counter()
            plan = plan_rewind(store, session_id, cursor)
            previews.append(time.perf_counter() - began)
            if len(plan.files) != files:
                raise RuntimeError("the plan misses files")
            began = time.perf_counter()
            with store.acquire_writer_lease(session_id) as lease:
                _, results = commit_rewind(store, lease, cursor, True, False)
            commits.append(time.perf_counter() - began)
            if results != ["restored"] * files:
                raise RuntimeError("a file was not restored")
    figure(f"store: rewind preview, {files} files", median(previews) * 1e3, "ms")
    figure(f"store: rewind commit, {files} files restored", median(commits) * 1e3, "ms")


async def main(args: argparse.Namespace) -> None:
    files = 10 if args.quick else FILES
    heading(f"bench_rewind: fork and rewind of a session with {files} changed files", args.quick)
    repeats = 1 if args.quick else 5
    await through_the_daemon(files, repeats)
    in_process(files, repeats)
    if not args.quick:
        in_process(10 * FILES, 3)


if __name__ == "__main__":
    run_with_daemons(main, __doc__ or "")
