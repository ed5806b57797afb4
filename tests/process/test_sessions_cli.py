"""``magi-code sessions list|show|rm|rename|archive|unarchive`` against sessions real
turns wrote, beside a running service (embedded, or the daemon behind the shim): what is
listed (filtered, by last activity) and shown, what is removed, what is refused while a
service holds the session's lease, and that renaming and archiving need no lease."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.process.turn_support import write_settings
from tests.support.cli import magi
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.service import running_service

# Both modes: a session is held by the embedded service or by the daemon.
pytestmark = pytest.mark.both_modes


def _session_line(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("magi-code: session ")]
    return line.removeprefix("magi-code: session ").strip()


def _listed(home: Path) -> dict[str, dict[str, object]]:
    result = magi(home, "sessions", "list", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["incomplete"] is False
    return {s["session_id"]: s for s in document["sessions"]}


def test_list_and_show_the_sessions_turns_left(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        write_settings(home, fake)
        call = FakeToolCall("c-1", "list_files", json.dumps({"pattern": "*.md"}))
        fake.enqueue(
            Reply(text=["Let me look."], tool_calls=[call]),
            Reply(text=["Found \x1b[31mnothing\x1b[0m.\nSecond line."]),
        )
        done = magi(home, "--prompt", "what is here?", cwd=project)
        assert done.returncode == 0, done.stderr
    answered = _session_line(done.stderr)
    # A provider that cannot be reached: the failed turn still leaves its session.
    (home / "settings.json").write_text(json.dumps({"provider": "anthropic", "model": "m"}))
    failed = magi(home, "--prompt", "this will fail", cwd=project)
    assert failed.returncode == 1
    broken = _session_line(failed.stderr)

    listed = _listed(home)
    assert list(listed) == sorted([answered, broken])  # the most recent activity last
    assert listed[answered]["title"] == "what is here?"
    assert listed[broken]["title"] == "this will fail"
    text = magi(home, "sessions", "list")
    assert text.returncode == 0
    rows = text.stdout.splitlines()
    assert [row.split()[0] for row in rows] == sorted([answered, broken])
    assert rows[0].endswith(str(listed[rows[0].split()[0]]["title"]))

    shown = magi(home, "sessions", "show", answered)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "user:",
        "what is here?",
        "",
        "assistant:",
        "Let me look.",
        '  · list_files {"pattern": "*.md"}',
        "",
        "assistant:",
        "Found [31mnothing[0m.",  # no escape character reaches the terminal
        "Second line.",
    ]
    failed_shown = magi(home, "sessions", "show", broken).stdout.splitlines()
    assert failed_shown == ["user:", "this will fail", "[turn failed]"]


def test_show_and_rm_name_what_is_wrong_with_an_id(home: Path) -> None:
    missing = "ses_00000000000000000000000000"
    shown = magi(home, "sessions", "show", missing)
    assert shown.returncode == 1
    assert shown.stderr == f"magi-code: {missing}: no such session in this MC_HOME\n"
    bad = magi(home, "sessions", "rm", "../escape", missing)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "magi-code: ../escape: not a session ID",
        f"magi-code: {missing}: no such session in this MC_HOME",
    ]
    empty = magi(home, "sessions", "list")
    assert empty.returncode == 0 and empty.stdout == "No sessions in this MC_HOME.\n"
    assert "usage: magi-code sessions rm" in magi(home, "sessions", "rm").stderr


async def test_rm_refuses_a_session_a_service_has_open(home: Path, project: Path) -> None:
    async with running_service(home, project) as service:
        held = (await service.request("session.create"))["payload"]["session_id"]
        free = (await service.request("session.create"))["payload"]["session_id"]
        await service.request("session.close", session_id=free)

        refused = magi(home, "sessions", "rm", held, free)
        assert refused.returncode == 1
        assert refused.stdout == f"Removed {free}\n"
        assert refused.stderr.startswith(f"magi-code: {held}: in use: a running magi-code")
        assert (home / "sessions" / held / "history.jsonl").is_file()
        assert sorted(os.listdir(home / "sessions")) == [held]
        # The holder keeps its session: it replays it, and a turn could still run.
        replay = await service.request("session.replay", session_id=held)
        assert replay["error"] is None
        gone = await service.request("session.open", session_id=free)
        assert gone["error"]["code"] == "session_unavailable"

        # Closed, it is removed (a daemon, running still, has no hold on an idle session).
        closed = await service.request("session.close", session_id=held)
        assert closed["payload"]["status"] == "closed"
        removed = magi(home, "sessions", "rm", held)
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout == f"Removed {held}\n"
        assert os.listdir(home / "sessions") == []
        listing = await service.request("session.list")
        assert listing["payload"]["sessions"] == []
        reopened = await service.request("session.open", session_id=held)
        assert reopened["error"]["code"] == "session_unavailable"


def _make_session(home: Path, project: Path) -> str:
    (home / "settings.json").write_text(json.dumps({"provider": "anthropic", "model": "m"}))
    return _session_line(magi(home, "--prompt", "leave a session", cwd=project).stderr)


def test_rm_leaves_a_session_holding_what_it_never_made(home: Path, project: Path) -> None:
    session_id = _make_session(home, project)
    planted = home / "sessions" / session_id / "notes"
    planted.mkdir()
    result = magi(home, "sessions", "rm", session_id)
    assert result.returncode == 1
    assert result.stderr == (
        f"magi-code: {session_id}: it holds files that are not yours (or a directory); "
        "nothing was removed\n"
    )
    assert planted.is_dir() and (planted.parent / "history.jsonl").is_file()
    assert session_id in _listed(home)


def test_rm_finishes_a_removal_that_a_crash_cut_short(home: Path, project: Path) -> None:
    cut_short, other = _make_session(home, project), _make_session(home, project)
    sessions = home / "sessions"
    # What a removal killed right after its rename leaves: no ID names it any more.
    os.rename(sessions / cut_short, sessions / f".rm-{cut_short}")
    result = magi(home, "sessions", "rm", other)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"Removed {other}\n", "")
    assert not (sessions / f".rm-{cut_short}").exists()
    assert not (sessions / other).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_rm_never_removes_another_users_file(home: Path, project: Path) -> None:
    session_id = _make_session(home, project)
    meta = home / "sessions" / session_id / "meta.json"
    os.chown(meta, 65534, 65534)
    result = magi(home, "sessions", "rm", session_id)
    assert result.returncode == 1 and "not yours" in result.stderr
    assert meta.is_file() and (meta.parent / "history.jsonl").is_file()


async def test_library_commands_beside_a_service_holding_the_session(
    home: Path, project: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = _make_session(home, other)  # a --prompt run in another project
    async with running_service(home, project) as service:
        held = (await service.request("session.create"))["payload"]["session_id"]

        mine = _library(home, "--project", str(project))
        assert [s["session_id"] for s in mine] == [held]
        assert mine[0]["project_dir"] == str(project.resolve())
        assert mine[0]["archived"] is False
        relative = magi(home, "sessions", "list", "--json", "--project", ".", cwd=other)
        assert [s["session_id"] for s in json.loads(relative.stdout)["sessions"]] == [elsewhere]
        # The most recent activity last.
        assert [s["session_id"] for s in _library(home)] == [elsewhere, held]

        # Metadata needs no lease: the session the service holds is renamed and archived.
        renamed = magi(home, "sessions", "rename", held, "Parser\x07 work")
        assert renamed.returncode == 0, renamed.stderr
        assert renamed.stdout == f"Renamed {held}\n"
        assert [s["session_id"] for s in _library(home, "--title", "PARSER")] == [held]
        text = magi(home, "sessions", "list", "--title", "parser").stdout
        assert text.endswith("  Parser work\n")
        listing = await service.request("session.list")
        titles = {s["session_id"]: s["title"] for s in listing["payload"]["sessions"]}
        assert titles[held] == "Parser work"

        archived = magi(home, "sessions", "archive", held)
        assert archived.returncode == 0 and archived.stdout == f"Archived {held}\n"
        assert [s["session_id"] for s in _library(home)] == [elsewhere]
        assert [s["session_id"] for s in _library(home, "--archived")] == [held]
        listing = await service.request("session.list")
        assert [s["session_id"] for s in listing["payload"]["sessions"]] == [elsewhere]
        # Archived, not deleted: its holder still replays it.
        assert (await service.request("session.replay", session_id=held))["error"] is None

        unarchived = magi(home, "sessions", "unarchive", held)
        assert unarchived.returncode == 0 and unarchived.stdout == f"Unarchived {held}\n"
        assert {s["session_id"] for s in _library(home)} == {elsewhere, held}
        none = magi(home, "sessions", "list", "--title", "no such title")
        assert none.returncode == 0 and none.stdout == "No matching sessions.\n"


def test_library_commands_name_what_is_wrong(home: Path, project: Path) -> None:
    session = _make_session(home, project)
    missing = "ses_00000000000000000000000000"
    bad = magi(home, "sessions", "archive", "../escape", missing, session)
    assert bad.returncode == 1 and bad.stdout == f"Archived {session}\n"
    assert bad.stderr.splitlines() == [
        "magi-code: ../escape: not a session ID",
        f"magi-code: {missing}: no such session in this MC_HOME",
    ]
    empty = magi(home, "sessions", "rename", session, " \x07 ")
    assert empty.returncode == 1
    assert empty.stderr == f"magi-code: {session}: the title has nothing to show\n"
    assert "usage: magi-code sessions rename" in magi(home, "sessions", "rename", session).stderr


def _library(home: Path, *filters: str) -> list[dict[str, object]]:
    result = magi(home, "sessions", "list", "--json", *filters)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["incomplete"] is False
    sessions = document["sessions"]
    assert isinstance(sessions, list)
    return sessions
