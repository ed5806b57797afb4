"""``magi-code grants list|revoke`` beside a real daemon: a session grant an answer left in
the daemon is listed and revoked through it, and the next call of that session is asked
again; a project grant is listed and revoked in the project settings file; a session
grant is stored with the session, so it outlives a daemon restart (listed and revoked
with no daemon running, honoured by the next daemon); a grant that is not there is
exit 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from magi_code.client import ApprovalRequest, Client
from tests.process.daemon.support import answered_turn, cli, context
from tests.process.turn_support import tool_call, tool_reply, write_settings
from tests.support.cli import magi
from tests.support.fake_providers import FakeProviderServer, Reply

COMMAND = "touch granted.txt"


async def _turn(
    client: Client, fake: FakeProviderServer, session_id: str | None
) -> tuple[str, ApprovalRequest | None]:
    """Run a turn whose model runs :data:`COMMAND`; answer a request ``allow_session``.
    Returns the session and the request (None when the call was not asked)."""
    fake.enqueue(tool_reply(tool_call("s1", "shell", command=COMMAND)))
    fake.enqueue(Reply(text=["done"]))
    terminal, asked = await answered_turn(client, "allow_session", session_id)
    assert terminal["status"] == "completed"
    return terminal["session_id"], asked


def _grants(home: Path, project: Path, *args: str) -> dict[str, object]:
    result = magi(home, "grants", "list", "--json", *args, cwd=project)
    assert result.returncode == 0, result.stderr
    document: dict[str, object] = json.loads(result.stdout)
    return document


async def test_session_and_project_grants_are_listed_and_revoked(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        write_settings(home, fake, approval_policy="ask", trusted_projects=[str(project)])
        settings = project / ".magi-code" / "settings.json"
        settings.parent.mkdir()
        settings.write_text(
            json.dumps({"approval_rules": {"allow": {"commands": [["make", "test"]]}}})
        )
        async with await Client.connect(context(home, project), approvals=True) as client:
            await client.request("initialize", {"supported_protocol_versions": [1]})
            session_id, asked = await _turn(client, fake, None)
            assert asked is not None

            listed = await asyncio.to_thread(_grants, home, project, "--session", session_id)
            assert listed == {
                "project": {"commands": [["make", "test"]], "tools": [], "paths": []},
                "project_honoured": True,
                "session": {"commands": [["touch", "granted.txt"]], "tools": [], "paths": []},
            }
            text = await asyncio.to_thread(
                magi, home, "grants", "list", "--session", session_id, cwd=project
            )
            assert "command  make test" in text.stdout
            assert "command  touch granted.txt" in text.stdout

            # Granted: the next call of the session runs unasked.
            assert (await _turn(client, fake, session_id))[1] is None
            revoke = ("grants", "revoke", "--session", session_id, "commands", "touch")
            gone = await asyncio.to_thread(magi, home, *revoke, "granted.txt", cwd=project)
            assert gone.returncode == 0, gone.stderr
            again = await asyncio.to_thread(magi, home, *revoke, "granted.txt", cwd=project)
            assert again.returncode == 1
            assert "no such session grant" in again.stderr
            # Revoked: asked again.
            assert (await _turn(client, fake, session_id))[1] is not None

        project_revoke = ("grants", "revoke", "--project", "commands", "make", "test")
        done = magi(home, *project_revoke, cwd=project)
        assert done.returncode == 0, done.stderr
        assert json.loads(settings.read_text())["approval_rules"]["allow"]["commands"] == []
        missing = magi(home, *project_revoke, cwd=project)
        assert missing.returncode == 1 and "no such project grant" in missing.stderr

    assert cli(home, "daemon", "stop").returncode == 0
    # The last turn's answer granted it again; stored with the session, it is listed
    # with no daemon running.
    listed = _grants(home, project, "--session", session_id)
    assert listed["session"] == {"commands": [["touch", "granted.txt"]], "tools": [], "paths": []}
    refused = magi(home, "grants", "revoke", "--session", session_id, "tools", "x", cwd=project)
    assert refused.returncode == 1 and "no such session grant" in refused.stderr
    usage = magi(home, "grants", "revoke", "--project", "tools", "a", "b", cwd=project)
    assert usage.returncode == 2


async def test_a_session_grant_outlives_a_daemon_restart(home: Path, project: Path) -> None:
    granted = {"commands": [["touch", "granted.txt"]], "tools": [], "paths": []}
    with FakeProviderServer() as fake:
        write_settings(home, fake, approval_policy="ask")
        async with await Client.connect(context(home, project), approvals=True) as client:
            await client.request("initialize", {"supported_protocol_versions": [1]})
            session_id, asked = await _turn(client, fake, None)
            assert asked is not None
        assert cli(home, "daemon", "stop").returncode == 0

        # No daemon runs: the grant is read from the session.
        assert _grants(home, project, "--session", session_id)["session"] == granted
        (project / "granted.txt").unlink()
        # A new daemon honours it: the call runs unasked.
        async with await Client.connect(context(home, project), approvals=True) as client:
            await client.request("initialize", {"supported_protocol_versions": [1]})
            assert (await _turn(client, fake, session_id))[1] is None
            assert (project / "granted.txt").exists()
            assert (await client.grants_list(session_id))["session"] == granted
            listed = await asyncio.to_thread(_grants, home, project, "--session", session_id)
            assert listed["session"] == granted
        assert cli(home, "daemon", "stop").returncode == 0

        # Revoked with no daemon running, in the session itself.
        revoke = ("grants", "revoke", "--session", session_id, "commands", "touch")
        gone = magi(home, *revoke, "granted.txt", cwd=project)
        assert gone.returncode == 0, gone.stderr
        again = magi(home, *revoke, "granted.txt", cwd=project)
        assert again.returncode == 1 and "no such session grant" in again.stderr
        assert _grants(home, project, "--session", session_id)["session"] == {
            "commands": [],
            "tools": [],
            "paths": [],
        }
        async with await Client.connect(context(home, project), approvals=True) as client:
            await client.request("initialize", {"supported_protocol_versions": [1]})
            assert (await _turn(client, fake, session_id))[1] is not None  # asked again
