"""Skills through the real service process, against the loopback fake providers: listed
in the system prompt (the recorded request body), loaded by the ``skill`` tool with a
``context_injection`` lifecycle, project over home, home skill files readable by
``read_file``, captured once per launch context, and hostile files skipped without a
hang."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

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


def _skill(root: Path, name: str, description: str, body: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    text = f"---\nname: {name}\ndescription: '{description}'\n---\n{body}\n"
    (folder / "SKILL.md").write_text(text)
    return folder


# -- skills --------------------------------------------------------------------------------


async def test_skills_are_listed_in_the_prompt_and_loaded_by_the_skill_tool(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    project_root = project / ".magi-code" / "skills"
    _skill(project_root, "release-notes", "Write release notes from the git log.", "PROJ-BODY")
    _skill(home / "skills", "release-notes", "Home version of the notes skill.", "HOME-NOTES")
    helper = _skill(home / "skills", "style-guide", "House style for prose.", "STYLE-BODY")
    (helper / "reference.md").write_text("STYLE-REFERENCE-CONTENT\n")
    shown = helper.resolve()
    write_settings(home, fake)
    fake.enqueue(
        tool_reply(tool_call("k1", "skill", name="release-notes")),
        tool_reply(tool_call("k2", "skill", name="style-guide")),
        tool_reply(tool_call("k3", "read_file", path=f"{shown}/reference.md")),
        Reply(text=["Skills used."]),
    )
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "write the notes")
    assert turn.terminal["status"] == "completed"
    posts = posted_bodies(fake)
    assert len(posts) == 4
    first = body_text(posts[0])
    # Names and descriptions in the system prompt, the project's on a clash; no body.
    assert "- release-notes: Write release notes from the git log." in first
    assert "- style-guide: House style for prose." in first
    assert "Home version" not in first
    for body in ("PROJ-BODY", "HOME-NOTES", "STYLE-BODY"):
        assert body not in first
    tool_names = [t["function"]["name"] for t in posts[0]["tools"]]
    assert "skill" in tool_names
    # The body came back as the tool result, with the folder and its files.
    second = body_text(posts[1])
    assert "PROJ-BODY" in second and "HOME-NOTES" not in second
    assert "Skill folder: .magi-code/skills/release-notes" in second
    third = body_text(posts[2])
    assert "STYLE-BODY" in third and f"{shown}/reference.md" in third
    # read_file reached the home skill's file by its absolute path.
    assert "STYLE-REFERENCE-CONTENT" in body_text(posts[3])
    # Each load: one context_injection lifecycle; the tool itself by its allowlisted name.
    injections = [a for a in turn.of_kind("lifecycle") if a["category"] == "context_injection"]
    assert [a["status"] for a in injections] == ["completed", "completed"]
    assert [a["tool_name"] for a in turn.of_kind("tool")] == ["skill"] * 4 + ["read_file"] * 2
    assert [a["status"] for a in turn.of_kind("tool")][1::2] == ["completed"] * 3
    activity = json.dumps(turn.activities)
    for needle in ("release-notes", "style-guide", "BODY", "reference", str(home)):
        assert needle not in activity, needle


async def test_without_skills_there_is_no_skill_tool_or_section(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["plain"]))
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "hi")
    assert turn.terminal["status"] == "completed"
    post = posted_bodies(fake)[0]
    assert "skill" not in [t["function"]["name"] for t in post["tools"]]
    assert "# Skills" not in body_text(post)


async def test_skills_are_captured_once_per_launch_context(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    root = project / ".magi-code" / "skills"
    _skill(root, "deploy", "Deploy version ONE.", "body")
    write_settings(home, fake)
    fake.set_default(Reply(text=["ok"]))
    async with running_service(home, project) as first:
        await run_turn(first, "one")
        _skill(root, "deploy", "Deploy version TWO.", "body")
        _skill(root, "added-later", "A skill added later.", "body")
        await run_turn(first, "two")
        # A second frontend: in daemon mode a new connection to the same daemon.
        async with running_service(home, project) as second:
            await run_turn(second, "three")
        await run_turn(first, "four")
    prompts = [body_text(post) for post in posted_bodies(fake)]
    assert len(prompts) == 4
    for index in (0, 1, 3):
        assert "Deploy version ONE." in prompts[index]
        assert "added-later" not in prompts[index]
    assert "Deploy version TWO." in prompts[2] and "added-later" in prompts[2]


async def test_hostile_skill_files_are_skipped_without_a_hang(
    home: Path, project: Path, fake: FakeProviderServer, fifos: list[Path], tmp_path: Path
) -> None:
    root = project / ".magi-code" / "skills"
    _skill(root, "fine", "A fine skill.", "body")
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "SKILL.md")
    fifos.append(root / "fifo" / "SKILL.md")
    _skill(root, "huge", "A huge skill.", "x" * 100_000)
    outside = _skill(tmp_path / "outside", "escaped", "Outside the tree.", "body")
    (root / "escaped").symlink_to(outside)
    (home / "skills").mkdir()
    os.mkfifo(home / "skills" / "pipe")
    fifos.append(home / "skills" / "pipe")
    write_settings(home, fake)
    fake.enqueue(Reply(text=["ok"]))
    async with running_service(home, project) as svc:
        _, turn = await asyncio.wait_for(run_turn(svc, "hi"), 30)
    assert turn.terminal["status"] == "completed"
    prompt = body_text(posted_bodies(fake)[0])
    assert "- fine: A fine skill." in prompt
    for name in ("fifo", "huge", "escaped", "pipe"):
        assert f"- {name}:" not in prompt
