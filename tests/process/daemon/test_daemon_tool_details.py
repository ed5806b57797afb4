"""Tool details and editor files through the daemon (RFC-0002 §6.8), on raw v2
connections with the loopback fake provider: only the connection that started a turn and
asked for them gets ``tool_detail`` frames, beside the unchanged v1 activity; a connection
that offers its editor answers ``fs_request`` frames and the tools use its text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magi_code.client import connect_channel
from tests.process.daemon.support import context
from tests.process.turn_support import (
    body_text,
    posted_bodies,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.v2peer import Frame, Peer


async def _peer(home: Path, project: Path, **options: Any) -> Peer:
    channel = await connect_channel(
        context(home, project), "persistent", autostart=True, client_name="t", options=options
    )
    return await Peer.over(channel)


async def _turn(peer: Peer, prompt: str) -> str:
    response = await peer.request("turn.start", {"prompt": prompt})
    assert response["error"] is None, response
    turn_id: str = response["payload"]["turn_id"]
    return turn_id


def _details(peer: Peer) -> list[Frame]:
    return [f for f in peer.seen if f["t"] == "tool_detail"]


async def test_details_go_only_to_the_connection_that_asked_and_v1_activity_is_unchanged(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    (project / "app.py").write_text("x = 1\n")
    edit = tool_call("c1", "edit_file", path="app.py", old_string="x = 1", new_string="x = 2")
    fake.enqueue(tool_reply(edit), Reply(text=["done"]))
    asking = await _peer(home, project, tool_details=True)
    plain = await _peer(home, project)
    try:
        turn_id = await _turn(asking, "edit it")
        events = await asking.turn_events(turn_id)
        tools = [
            e["payload"]["activity"]
            for e in events
            if e["event"] == "turn.activity" and e["payload"]["activity"]["kind"] == "tool"
        ]
        assert {a["details_omitted"] for a in tools} == {True}
        assert all("arguments" not in a and "path" not in a for a in tools)
        call, diff = _details(asking)
        assert call["turn_id"] == turn_id and call["activity_id"] == tools[0]["activity_id"]
        assert call["call"] == {
            "tool": "edit_file",
            "arguments": {"path": "app.py", "old_string": "x = 1", "new_string": "x = 2"},
            "truncated": False,
            "locations": [{"path": "app.py"}],
        }
        assert diff["activity_id"] == call["activity_id"]
        assert diff["diff"] == {
            "path": "app.py",
            "old_text": "x = 1\n",
            "new_text": "x = 2\n",
            "truncated": False,
        }

        again = tool_call("c2", "edit_file", path="app.py", old_string="x = 2", new_string="x = 3")
        fake.enqueue(tool_reply(again), Reply(text=["done"]))
        await plain.turn_events(await _turn(plain, "again"))
        assert _details(plain) == []
        assert (project / "app.py").read_text() == "x = 3\n"
    finally:
        await asking.close()
        await plain.close()


async def test_an_offered_editor_answers_the_file_tools(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    (project / "app.py").write_text("on disk\n")
    fake.enqueue(
        tool_reply(tool_call("c1", "read_file", path="app.py")),
        tool_reply(tool_call("c2", "write_file", path="app.py", content="from the model\n")),
        tool_reply(tool_call("c3", "read_file", path="gone.py")),
        Reply(text=["done"]),
    )
    editor = await _peer(home, project, editor_files=["read", "write"])
    try:
        turn_id = await _turn(editor, "read it")
        read = await editor.until(lambda f: f["t"] == "fs_request")
        assert (read["op"], read["path"], read["turn_id"]) == ("read", "app.py", turn_id)
        await editor.channel.send({"t": "fs_result", "fs_id": read["fs_id"], "content": "buffer\n"})
        # write_file reads the old text first (for its diff), then writes.
        old = await editor.until(lambda f: f["t"] == "fs_request")
        await editor.channel.send({"t": "fs_result", "fs_id": old["fs_id"], "content": "buffer\n"})
        write = await editor.until(lambda f: f["t"] == "fs_request")
        assert (write["op"], write["path"], write["content"]) == (
            "write",
            "app.py",
            "from the model\n",
        )
        await editor.channel.send({"t": "fs_result", "fs_id": write["fs_id"]})
        missing = await editor.until(lambda f: f["t"] == "fs_request")
        await editor.channel.send(
            {"t": "fs_result", "fs_id": missing["fs_id"], "error": "no such buffer"}
        )
        events = await editor.turn_events(turn_id)
        assert events[-1]["payload"]["status"] == "completed"
    finally:
        await editor.close()
    bodies = [body_text(b) for b in posted_bodies(fake)]
    assert "buffer" in bodies[1]
    assert "The editor could not read gone.py: no such buffer" in bodies[3]
    assert (project / "app.py").read_text() == "on disk\n"
