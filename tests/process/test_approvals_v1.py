"""Approval policies seen by a v1 frontend (embedded and daemon modes), against the
loopback fake providers: under ``ask`` a call that needs approval is refused at once with
the fixed text and the turn completes; ``read_only`` refuses writes and commands; a deny
rule refuses even under ``auto``; an allow rule lets a simple command run; a project file
cannot loosen the global policy unless the project is trusted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.process.turn_support import (
    body_text,
    posted_bodies,
    run_turn,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import running_service

CANNOT_APPROVE = "needs approval: this frontend cannot approve"


async def _turn_with(
    home: Path, project: Path, fake: FakeProviderServer, *calls: Any
) -> tuple[dict[str, Any], str]:
    fake.enqueue(tool_reply(*calls), Reply(text=["done"]))
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "do it")
    return turn.terminal, body_text(posted_bodies(fake)[1])


async def test_v1_under_ask_gets_the_fixed_refusal_and_the_turn_completes(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="ask")
    terminal, result = await _turn_with(
        home,
        project,
        fake,
        tool_call("s1", "shell", command="touch made-by-shell.txt"),
        tool_call("w1", "write_file", path="written.txt", content="x"),
        tool_call("r1", "list_files", path="."),
    )
    assert terminal["status"] == "completed"
    assert terminal["assistant_text"] == "done"
    assert not (project / "made-by-shell.txt").exists()
    assert not (project / "written.txt").exists()
    assert result.count(CANNOT_APPROVE) == 2  # the read-only listing ran


async def test_read_only_refuses_writes_and_commands(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, approval_policy="read_only")
    (project / "kept.txt").write_text("old\n")
    terminal, result = await _turn_with(
        home,
        project,
        fake,
        tool_call("e1", "edit_file", path="kept.txt", old_string="old", new_string="new"),
        tool_call("s1", "shell", command="touch made-by-shell.txt"),
    )
    assert terminal["status"] == "completed"
    assert (project / "kept.txt").read_text() == "old\n"
    assert not (project / "made-by-shell.txt").exists()
    assert result.count("refused: the approval policy is read_only") == 2


async def test_rules_deny_wins_and_allow_runs_simple_commands_only(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    rules = {
        "allow": {"commands": [["touch", "allowed.txt"], ["touch"]]},
        "deny": {"commands": [["touch", "denied.txt"]]},
    }
    write_settings(home, fake, approval_policy="ask", approval_rules=rules)
    terminal, result = await _turn_with(
        home,
        project,
        fake,
        tool_call("s1", "shell", command="touch allowed.txt"),
        tool_call("s2", "shell", command="touch denied.txt"),
        # A compound command is never allowed by a prefix: it would be asked.
        tool_call("s3", "shell", command="touch x.txt && touch compound.txt"),
        # A deny prefix matches any simple command of a compound one.
        tool_call("s4", "shell", command="true; touch denied.txt"),
    )
    assert terminal["status"] == "completed"
    assert (project / "allowed.txt").exists()
    assert not (project / "denied.txt").exists()
    assert not (project / "compound.txt").exists()
    assert result.count("refused by an approval rule") == 2
    assert result.count(CANNOT_APPROVE) == 1


async def test_an_untrusted_project_cannot_loosen_the_policy(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    (project / ".magi-code").mkdir()
    project_doc = {"approval_policy": "auto", "approval_rules": {"allow": {"tools": ["*"]}}}
    (project / ".magi-code" / "settings.json").write_text(json.dumps(project_doc))
    write_settings(home, fake, approval_policy="ask")
    _, result = await _turn_with(
        home, project, fake, tool_call("s1", "shell", command="touch made-by-shell.txt")
    )
    assert not (project / "made-by-shell.txt").exists()
    assert CANNOT_APPROVE in result
    # Trusted, the same project file runs the command.
    write_settings(home, fake, approval_policy="ask", trusted_projects=[str(project)])
    _, result = await _turn_with(
        home, project, fake, tool_call("s1", "shell", command="touch made-by-shell.txt")
    )
    assert (project / "made-by-shell.txt").exists()
