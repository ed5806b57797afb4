"""Fork and rewind (RFC-0002 §6.16) through a real daemon, with the fake provider making
real ``write_file``/``edit_file`` calls and a ``shell`` call that edits a file git tracks.

A fork at a turn's end has exactly the history up to it (the original keeps its own) and
both sessions name each other; a rewind preview lists the messages that go and the files
the agent changed, reports a file edited outside the agent as a conflict, and its commit
restores the others byte for byte (mode kept), removes the file the agent created and
leaves the conflicting one alone; the next turn's conversation ends at the cursor, and
watchers are told. Only the session's controller may commit (``session_busy`` else; a
preview is a read), never while a turn runs (``turn_running``); cursors inside a turn or
not of the history are refused. The sync client and ``magi-code sessions fork|rewind``
do the same."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from magi_code.client import Client, Rewound, SessionError, SyncClient, Watched
from tests.process.daemon.support import cli, context, persistent, wait_for
from tests.process.turn_support import held_shell, tool_call, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply

TRACKED_BEFORE = b"tracked \xff\x00 bytes\r\n"
SEEN_BEFORE = b"seen before\n"


def _git_project(project: Path) -> None:
    (project / "tracked.bin").write_bytes(TRACKED_BEFORE)
    (project / "tracked.bin").chmod(0o640)
    (project / "seen.txt").write_bytes(SEEN_BEFORE)
    for argv in (["git", "init", "-q"], ["git", "add", "tracked.bin", "seen.txt"]):
        subprocess.run(argv, cwd=project, check=True, capture_output=True, timeout=30)


async def _turn(client: Client, prompt: str, session_id: str | None = None) -> str:
    payload: dict[str, Any] = {"prompt": prompt}
    reply = await client.request("turn.start", payload, session_id=session_id)
    assert reply["error"] is None, reply
    async for event in client.events():
        if event["event"] == "turn.terminal":
            assert event["payload"]["status"] == "completed", event
            break
    return str(reply["payload"]["session_id"])


async def _replay(client: Client, session_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after = None
    while True:
        reply = await client.request("session.replay", {"after": after}, session_id=session_id)
        assert reply["error"] is None, reply
        page = reply["payload"]
        items += page["events"]
        after = page["next_cursor"]
        if not page["truncated"]:
            return items


def _bodies(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "cursor"} for item in items]


async def _two_turns(client: Client, project: Path, fake: FakeProviderServer) -> str:
    """Turn one creates ``a.txt``; turn two edits it, overwrites ``seen.txt``, creates
    ``new.txt`` and a shell command rewrites the tracked ``tracked.bin``."""
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("c1", "write_file", path="a.txt", content="A1\n")]),
        Reply(text=["one"]),
        Reply(
            text=[],
            tool_calls=[
                tool_call("c2", "edit_file", path="a.txt", old_string="A1", new_string="A2"),
                tool_call("c3", "write_file", path="seen.txt", content="agent wrote\n"),
                tool_call("c4", "write_file", path="new.txt", content="N\n"),
                tool_call("c5", "shell", command="printf 'shell wrote' > tracked.bin"),
            ],
        ),
        Reply(text=["two"]),
    )
    session_id = await _turn(client, "first")
    await _turn(client, "second", session_id)
    assert (project / "a.txt").read_text() == "A2\n"
    assert (project / "tracked.bin").read_bytes() == b"shell wrote"
    return session_id


async def test_fork_and_rewind_with_files(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    _git_project(project)
    client = await persistent(home, project)
    other = await persistent(home, project)
    try:
        assert {"session.fork", "session.rewind"} <= set(client.welcome["capabilities"])
        session_id = await _two_turns(client, project, fake)
        items = await _replay(client, session_id)
        kinds = [(i["kind"], i.get("role"), i.get("text")) for i in items]
        assert kinds == [
            ("message", "user", "first"),
            ("message", "assistant", "one"),
            ("terminal", None, None),
            ("message", "user", "second"),
            ("message", "assistant", "two"),
            ("terminal", None, None),
        ], kinds
        after_one = items[2]["cursor"]

        # A fork at the end of turn one has exactly its history; the original keeps its own.
        fork = await other.fork_session(session_id, after_one)
        fork_id = fork["session_id"]
        assert fork_id != session_id
        assert fork["forked_from"] == {"session_id": session_id, "at_cursor": after_one}
        assert _bodies(await _replay(other, fork_id)) == _bodies(items[:3])
        assert _bodies(await _replay(other, session_id)) == _bodies(items)
        listed = {s["session_id"]: s for s in (await other.list_sessions())["sessions"]}
        assert listed[session_id]["forks"] == [fork_id]
        assert listed[fork_id]["forked_from"]["session_id"] == session_id
        # Cursors inside a turn, or not of this history, are refused.
        with pytest.raises(SessionError) as inside:
            await other.fork_session(session_id, items[1]["cursor"])
        assert inside.value.code == "not_turn_boundary"
        with pytest.raises(SessionError) as stale:
            await other.fork_session(session_id, "AAAA")
        assert stale.value.code == "resync_required"

        # A file changed outside the agent since is a conflict in the preview.
        (project / "seen.txt").write_text("edited by hand\n")
        preview = await other.rewind_session(session_id, after_one)
        assert preview["committed"] is False
        assert [(m["kind"], m.get("text")) for m in preview["messages"]] == [
            ("message", "second"),
            ("message", "two"),
            ("terminal", None),
        ]
        states = {f["path"]: f["state"] for f in preview["files"]}
        assert states == {
            "a.txt": "restore",
            "seen.txt": "conflict",
            "new.txt": "restore",
            "tracked.bin": "restore",
        }, states
        assert preview["file_states"] == {"restore": 3, "conflict": 1}
        assert (project / "a.txt").read_text() == "A2\n"  # a preview changes nothing

        # A watcher of the session is told of the rewind.
        watcher = await persistent(home, project)
        await watcher.watch(session_id)
        told = asyncio.create_task(_next_rewound(watcher))

        # Committing takes control: not while another client holds the session open.
        opened = await client.request("session.open", {}, session_id=session_id)
        assert opened["error"] is None, opened
        with pytest.raises(SessionError) as busy:
            await other.rewind_session(session_id, after_one, commit=True)
        assert busy.value.code == "session_busy"
        assert (project / "a.txt").read_text() == "A2\n"
        done = await client.rewind_session(session_id, after_one, commit=True)
        assert done["committed"] is True
        assert {f["path"]: f["state"] for f in done["files"]} == {
            "a.txt": "restored",
            "seen.txt": "conflict",
            "new.txt": "restored",
            "tracked.bin": "restored",
        }
        assert (project / "a.txt").read_bytes() == b"A1\n"
        assert (project / "tracked.bin").read_bytes() == TRACKED_BEFORE
        assert (project / "tracked.bin").stat().st_mode & 0o777 == 0o640
        assert not (project / "new.txt").exists()
        assert (project / "seen.txt").read_text() == "edited by hand\n"  # left alone
        assert _bodies(await _replay(client, session_id)) == _bodies(items[:3])
        assert await asyncio.wait_for(told, 60) == Rewound(session_id, after_one)
        await watcher.close()

        # The next turn's conversation ends at the cursor.
        fake.enqueue(Reply(text=["three"]))
        await _turn(client, "third", session_id)
        last = [r.json for r in fake.requests if r.path.endswith("/completions")][-1]
        said = json.dumps(last["messages"])
        assert "first" in said and "third" in said
        assert "second" not in said and "two" not in said
        after = [(i["kind"], i.get("text")) for i in await _replay(client, session_id)]
        assert after[3:] == [("message", "third"), ("message", "three"), ("terminal", None)]
    finally:
        await client.close()
        await other.close()


async def test_no_rewind_while_a_turn_runs(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    started, release, command = held_shell(project)
    fake.enqueue(
        Reply(text=["done"]),
        Reply(text=[], tool_calls=[tool_call("c1", "shell", command=command)]),
        Reply(text=["waited"]),
    )
    client = await persistent(home, project)
    try:
        session_id = await _turn(client, "first")
        start = await client.request("turn.start", {"prompt": "wait"}, session_id=session_id)
        assert start["error"] is None, start
        await wait_for(started.exists, 60, "the tool to start")
        cursor = (await _replay(client, session_id))[2]["cursor"]
        with pytest.raises(SessionError) as running:
            await client.rewind_session(session_id, cursor, commit=True)
        assert running.value.code == "turn_running"
        release.touch()
        async for event in client.events():
            if event["event"] == "turn.terminal":
                break
    finally:
        await client.close()


def test_sync_client_and_cli(home: Path, project: Path, fake: FakeProviderServer) -> None:
    write_settings(home, fake)
    fake.enqueue(
        Reply(text=[], tool_calls=[tool_call("c1", "write_file", path="w.txt", content="W1")]),
        Reply(text=["one"]),
        Reply(text=[], tool_calls=[tool_call("c2", "write_file", path="w.txt", content="W2")]),
        Reply(text=["two"]),
    )

    async def turns() -> tuple[str, list[dict[str, Any]]]:
        client = await persistent(home, project)
        try:
            session_id = await _two_turns_plain(client)
            return session_id, await _replay(client, session_id)
        finally:
            await client.close()

    session_id, items = asyncio.run(turns())
    cursor = items[2]["cursor"]
    with SyncClient.connect(context(home, project)) as sync:
        fork = sync.fork_session(session_id, cursor)
        preview = sync.rewind_session(session_id, cursor)
    assert fork["forked_from"]["session_id"] == session_id
    assert preview["files"] == [{"path": "w.txt", "state": "restore"}]

    shown = cli(home, "sessions", "rewind", session_id, cursor)
    assert shown.returncode == 0, shown.stderr
    assert "w.txt" in shown.stdout and "restore" in shown.stdout
    assert (project / "w.txt").read_text() == "W2"  # a preview only
    done = cli(home, "sessions", "rewind", session_id, cursor, "--yes")
    assert done.returncode == 0, done.stderr
    assert (project / "w.txt").read_text() == "W1"
    forked = cli(home, "sessions", "fork", session_id, "turn:1")
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.split()[-1] != session_id


async def _next_rewound(client: Client) -> Rewound:
    async for item in client.events():
        if isinstance(item, Watched) and isinstance(item.event, Rewound):
            return item.event
    raise AssertionError("the watch ended without a rewound event")


async def _two_turns_plain(client: Client) -> str:
    session_id = await _turn(client, "first")
    await _turn(client, "second", session_id)
    return session_id
