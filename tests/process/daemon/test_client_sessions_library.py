"""The session library through the client library against a real daemon (RFC-0002
§6.11): sessions record the project of the client that created them; ``list_sessions``
filters by project, title and archived state, most recent activity first, paged by
cursor; ``rename_session`` and ``archive_session`` work on a session another client holds
open; archived sessions leave the default v2 and v1 lists and come back when unarchived;
refusals raise :class:`SessionError` with the spec's codes. The sync client does the same."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from magi_code.client import Client, SessionError, SyncClient
from tests.process.daemon.support import context

INITIALIZE = {"supported_protocol_versions": [1]}


async def _create(client: Client) -> str:
    response = await client.request("session.create", {})
    assert response["error"] is None
    session_id = response["payload"]["session_id"]
    assert isinstance(session_id, str)
    return session_id


async def _v1_listed(client: Client) -> list[str]:
    response = await client.request("session.list", {})
    assert response["error"] is None
    listed = response["payload"]["sessions"]
    # v1 items keep exactly their v1 fields.
    assert all(set(item) == {"session_id", "title", "updated_at"} for item in listed)
    return [item["session_id"] for item in listed]


def _set_activity(home: Path, session_id: str, seconds: int) -> None:
    history = home / "sessions" / session_id / "history.jsonl"
    os.utime(history, ns=(seconds * 10**9, seconds * 10**9))


async def test_library_through_the_client(home: Path, project: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-project"
    other.mkdir()
    async with (
        await Client.connect(context(home, project)) as here,
        await Client.connect(context(home, other)) as there,
    ):
        assert "session.library" in here.welcome["capabilities"]
        for client in (here, there):
            assert (await client.request("initialize", INITIALIZE))["error"] is None
        mine = await _create(here)  # held open by ``here``
        theirs = await _create(there)
        _set_activity(home, mine, 1_700_000_100)
        _set_activity(home, theirs, 1_700_000_200)

        page = await there.list_sessions()
        assert [s["session_id"] for s in page["sessions"]] == [theirs, mine]
        assert page["next_cursor"] is None and page["incomplete"] is False
        by_id = {s["session_id"]: s for s in page["sessions"]}
        assert by_id[mine]["project_dir"] == str(project.resolve())
        assert by_id[theirs]["project_dir"] == str(other.resolve())

        first = await there.list_sessions(limit=1)
        assert [s["session_id"] for s in first["sessions"]] == [theirs]
        assert first["next_cursor"] is not None
        rest = await there.list_sessions(limit=1, cursor=first["next_cursor"])
        assert [s["session_id"] for s in rest["sessions"]] == [mine]
        assert rest["next_cursor"] is None

        only_here = await there.list_sessions(project_dir=str(project))
        assert [s["session_id"] for s in only_here["sessions"]] == [mine]

        # ``here`` holds ``mine`` open: another client renames and archives it anyway.
        renamed = await there.rename_session(mine, "Parser\x07 work")
        assert renamed["title"] == "Parser work" and renamed["session_id"] == mine
        found = await here.list_sessions(title="PARSER")
        assert [s["session_id"] for s in found["sessions"]] == [mine]
        v1 = await here.request("session.list", {})
        assert {i["session_id"]: i["title"] for i in v1["payload"]["sessions"]}[mine] == (
            "Parser work"
        )

        archived = await there.archive_session(mine)
        assert archived["archived"] is True
        assert [s["session_id"] for s in (await here.list_sessions())["sessions"]] == [theirs]
        assert await _v1_listed(here) == [theirs]
        hidden = await here.list_sessions(archived=True)
        assert [s["session_id"] for s in hidden["sessions"]] == [mine]
        everything = await here.list_sessions(archived="all")
        assert {s["session_id"] for s in everything["sessions"]} == {mine, theirs}
        # Archived, never deleted: the holder still replays it.
        replay = await here.request("session.replay", {}, session_id=mine)
        assert replay["error"] is None

        assert (await there.unarchive_session(mine))["archived"] is False
        assert sorted(await _v1_listed(here)) == sorted([mine, theirs])


async def test_refusals_raise_session_error(home: Path, project: Path) -> None:
    async with await Client.connect(context(home, project)) as client:
        assert (await client.request("initialize", INITIALIZE))["error"] is None
        session_id = await _create(client)
        cases = [
            (client.rename_session("../etc", "x"), "invalid_session_id"),
            (client.archive_session("ses_" + "0" * 26), "session_unavailable"),
            (client.rename_session(session_id, " \x07 "), "invalid_request"),
            (client.list_sessions(cursor="not-a-cursor"), "invalid_request"),
            (client.list_sessions(project_dir="relative/dir"), "invalid_request"),
            (client.list_sessions(limit=33), "invalid_request"),
        ]
        for call, code in cases:
            with pytest.raises(SessionError) as caught:
                await call
            assert caught.value.code == code
        # The connection is still usable after every refusal.
        assert (await client.list_sessions())["sessions"][0]["session_id"] == session_id


def test_sync_client_library(home: Path, project: Path) -> None:
    with SyncClient.connect(context(home, project)) as client:
        assert client.request("initialize", INITIALIZE)["error"] is None
        created = client.request("session.create", {})
        session_id = created["payload"]["session_id"]
        assert client.rename_session(session_id, "Sync title")["title"] == "Sync title"
        assert client.archive_session(session_id)["archived"] is True
        assert client.list_sessions()["sessions"] == []
        listed = client.list_sessions(archived=True, project_dir=str(project))
        assert [s["title"] for s in listed["sessions"]] == ["Sync title"]
        assert client.unarchive_session(session_id)["archived"] is False
