"""Skills: the SKILL.md subset, discovery (precedence, bounds, hostile files), the
per-launch-context cache, the ``skill`` tool and ``read_file`` over home skill folders."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from magi_code.storage.launch import LaunchContext
from magi_code.tools.base import ToolContext
from magi_code.tools.files import ReadFile
from magi_code.turns import skills
from magi_code.turns.skills import (
    MAX_SKILL_FILE_BYTES,
    MAX_SKILLS,
    SkillCache,
    SkillFileError,
    SkillReadFile,
    discover_skills,
    parse_skill_file,
    skill_from_text,
    turn_tools,
)


def write_skill(
    root: Path, name: str, description: str = "Does things.", body: str = "Body.", **extra: str
) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["---", f"name: {name}", f"description: {description}"]
    lines += [f"{key}: {value}" for key, value in extra.items()]
    (folder / "SKILL.md").write_text("\n".join([*lines, "---", body, ""]))
    return folder


def _roots(home: Path, project: Path) -> tuple[Path, Path]:
    return project / ".magi-code" / "skills", home / "skills"


# -- the front matter subset ---------------------------------------------------------------


def test_front_matter_subset() -> None:
    text = (
        "\ufeff---\r\n"
        "# a comment\n"
        "name: pdf-tools   # trailing comment\n"
        "description: >\n"
        "  Extract text\n"
        "  and tables.\n"
        "\n"
        "  Second paragraph.\n"
        "license: 'Apache '' 2.0'\n"
        'quoted: "a \\"b\\" \\u00e9" # comment\n'
        "literal: |\n"
        "  line one\n"
        "    indented\n"
        "metadata:\n"
        "  author: someone\n"
        "  tags:\n"
        "    - x\n"
        "empty:\n"
        "---\n"
        "# Body\n\nSteps.\n"
    )
    fields, body = parse_skill_file(text)
    assert fields == {
        "name": "pdf-tools",
        "description": "Extract text and tables.\nSecond paragraph.",
        "license": "Apache ' 2.0",
        "quoted": 'a "b" é',
        "literal": "line one\n  indented",
        "metadata": "",
        "empty": "",
    }
    assert body == "# Body\n\nSteps."
    name, description, _ = skill_from_text(text, "pdf-tools")
    assert (name, description) == ("pdf-tools", "Extract text and tables. Second paragraph.")


@pytest.mark.parametrize(
    "text",
    [
        "no front matter\n",
        "---\nname: x\n",  # unterminated
        "---\nname: a\nname: b\n---\n",  # repeated key
        "---\n- a list item\n---\n",
        "---\nname: 'unclosed\n---\n",
        '---\nname: "unclosed\n---\n',
        "---\nname: 'x' trailing\n---\n",
    ],
)
def test_unsupported_front_matter_is_an_error(text: str) -> None:
    with pytest.raises(SkillFileError):
        parse_skill_file(text)


@pytest.mark.parametrize(
    ("text", "directory"),
    [
        ("---\nname: other\ndescription: d\n---\n", "mine"),  # not the directory's name
        ("---\nname: Bad_Name\ndescription: d\n---\n", "Bad_Name"),
        ("---\nname: a--b\ndescription: d\n---\n", "a--b"),
        ("---\nname: mine\n---\n", "mine"),  # no description
        ("---\nname: mine\ndescription: ''\n---\n", "mine"),
        (f"---\nname: mine\ndescription: {'d' * 1025}\n---\n", "mine"),
    ],
)
def test_invalid_names_and_descriptions_are_refused(text: str, directory: str) -> None:
    with pytest.raises(SkillFileError):
        skill_from_text(text, directory)


# -- discovery -----------------------------------------------------------------------------


def test_project_skills_win_over_home_skills(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    project_root, home_root = _roots(home, project)
    write_skill(project_root, "shared", "Project version.", "project body")
    write_skill(home_root, "shared", "Home version.", "home body")
    write_skill(home_root, "home-only", "Only at home.")
    write_skill(project_root, "project-only", "Only here.")
    catalog = discover_skills(project, home)
    assert list(catalog.skills) == ["home-only", "project-only", "shared"]
    shared = catalog.skills["shared"]
    assert (shared.scope, shared.description, shared.body) == (
        "project",
        "Project version.",
        "project body",
    )
    assert shared.shown_directory == ".magi-code/skills/shared"
    home_only = catalog.skills["home-only"]
    assert home_only.scope == "home"
    assert home_only.shown_directory == str(home_root.resolve() / "home-only")
    assert catalog.home_directories() == (home_root.resolve() / "home-only",)


def test_no_skill_directories_is_an_empty_catalog(tmp_path: Path) -> None:
    catalog = discover_skills(tmp_path / "project", tmp_path / "home")
    assert not catalog
    assert skills.prompt_section(catalog) is None


def test_bounds_and_hostile_files_are_skipped(tmp_path: Path, fifos: list[Path]) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    project_root = _roots(home, project)[0]
    write_skill(project_root, "good")
    # Too large: skipped whole, not truncated.
    write_skill(project_root, "huge", body="x" * MAX_SKILL_FILE_BYTES)
    # A FIFO as SKILL.md: refused without blocking.
    (project_root / "fifo").mkdir()
    os.mkfifo(project_root / "fifo" / "SKILL.md")
    fifos.append(project_root / "fifo" / "SKILL.md")
    # A FIFO where a skill directory would be.
    os.mkfifo(project_root / "pipe-dir")
    fifos.append(project_root / "pipe-dir")
    # A symlinked SKILL.md and a symlinked skill directory, both leading out of the tree.
    outside = write_skill(tmp_path / "outside", "escape")
    (project_root / "link-file").mkdir()
    (project_root / "link-file" / "SKILL.md").symlink_to(outside / "SKILL.md")
    (project_root / "escape").symlink_to(outside)
    # Not UTF-8, NUL bytes, an invalid directory name, a name that is not the directory's.
    (project_root / "latin").mkdir()
    (project_root / "latin" / "SKILL.md").write_bytes(
        b"---\nname: latin\ndescription: caf\xe9\n---\n"
    )
    write_skill(project_root, "nul", body="a\0b")
    write_skill(project_root, "Upper_Case")
    misnamed = write_skill(project_root, "misnamed")
    (misnamed / "SKILL.md").write_text("---\nname: other\ndescription: d\n---\n")
    catalog = discover_skills(project, home)
    assert list(catalog.skills) == ["good"]


def test_a_project_skills_root_leading_out_of_the_project_is_ignored(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    elsewhere = tmp_path / "elsewhere"
    write_skill(elsewhere, "foreign")
    (project / ".magi-code").mkdir(parents=True)
    (project / ".magi-code" / "skills").symlink_to(elsewhere)
    assert not discover_skills(project, home)
    # The home root may be a symlink: the user chose it.
    home.mkdir()
    (home / "skills").symlink_to(elsewhere)
    assert list(discover_skills(project, home).skills) == ["foreign"]


def test_the_number_of_skills_is_bounded(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    project_root, home_root = _roots(home, project)
    for index in range(MAX_SKILLS + 5):
        write_skill(project_root, f"skill-{index:03d}")
    write_skill(home_root, "home-skill")
    catalog = discover_skills(project, home)
    assert len(catalog.skills) == MAX_SKILLS
    assert "home-skill" not in catalog.skills
    assert list(catalog.skills) == sorted(catalog.skills)


def test_the_prompt_section_lists_names_and_descriptions_only(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    write_skill(_roots(home, project)[0], "alpha", "First  skill\tdescription.", "SECRET-BODY")
    section = skills.prompt_section(discover_skills(project, home))
    assert section is not None
    assert "- alpha: First skill description." in section
    assert "SECRET-BODY" not in section


# -- the cache -----------------------------------------------------------------------------


async def test_the_cache_keeps_one_catalog_per_launch_context(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    root = _roots(home, project)[0]
    write_skill(root, "alpha", "Version one.")
    cache = SkillCache(limit=2)
    first_ctx = LaunchContext(home, project, {})
    first = await cache.catalog(first_ctx)
    write_skill(root, "alpha", "Version two.")
    # The same context keeps what it captured.
    assert await cache.catalog(first_ctx) is first
    assert first.skills["alpha"].description == "Version one."
    # A new context (a new daemon connection) captures afresh.
    second = await cache.catalog(LaunchContext(home, project, {}))
    assert second.skills["alpha"].description == "Version two."
    # Concurrent first turns of one context share one discovery.
    third_ctx = LaunchContext(home, project, {})
    a, b = await asyncio.gather(cache.catalog(third_ctx), cache.catalog(third_ctx))
    assert a is b
    # Beyond the limit the least recently used context is dropped and discovers again.
    assert await cache.catalog(first_ctx) is not first


# -- the tools -----------------------------------------------------------------------------


async def test_the_skill_tool_returns_the_body_and_the_files(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    project_root, home_root = _roots(home, project)
    folder = write_skill(home_root, "helper", body="Use reference.md.")
    (folder / "reference.md").write_text("REFERENCE")
    (folder / "scripts").mkdir()
    (folder / "scripts" / "run.py").write_text("print(1)")
    (folder / "link.md").symlink_to(tmp_path / "anything")
    write_skill(project_root, "local", body="Local body.")
    emitted: list[dict[str, Any]] = []
    tools = {
        t.name: t
        for t in turn_tools(discover_skills(project, home), [ReadFile()], emitted.append, "t1")
    }
    ctx = ToolContext(project_dir=project)
    outcome = await tools["skill"].run({"name": "helper"}, ctx)
    assert not outcome.is_error
    shown = str(home_root.resolve() / "helper")
    assert "Use reference.md." in outcome.output
    assert f"- {shown}/reference.md" in outcome.output
    assert f"- {shown}/scripts/run.py" in outcome.output
    assert "link.md" not in outcome.output and "SKILL.md" not in outcome.output
    local = await tools["skill"].run({"name": "local"}, ctx)
    assert "Local body." in local.output and "Skill folder: .magi-code/skills/local" in local.output
    assert [(a["kind"], a["category"], a["status"]) for a in emitted] == [
        ("lifecycle", "context_injection", "completed")
    ] * 2
    assert emitted[0]["activity_id"] != emitted[1]["activity_id"]
    unknown = await tools["skill"].run({"name": "nope"}, ctx)
    assert unknown.is_error and "helper, local" in unknown.output
    assert len(emitted) == 2


async def test_read_file_reaches_home_skill_folders_and_nothing_else(
    tmp_path: Path, fifos: list[Path]
) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    (project / "mine.txt").write_text("PROJECT FILE")
    folder = write_skill(home / "skills", "helper")
    (folder / "reference.md").write_text("REFERENCE")
    (home / "auth.json").write_text("CREDENTIALS")
    (folder / "creds.md").symlink_to(home / "auth.json")
    os.mkfifo(folder / "pipe.md")
    fifos.append(folder / "pipe.md")
    read = SkillReadFile(ReadFile(), discover_skills(project, home).home_directories())
    ctx = ToolContext(project_dir=project)
    real = folder.resolve()

    async def output(path: str) -> tuple[str, bool]:
        outcome = await asyncio.wait_for(read.run({"path": path}, ctx), 5)
        return outcome.output, outcome.is_error

    assert await output(f"{real}/reference.md") == ("REFERENCE", False)
    assert await output("mine.txt") == ("PROJECT FILE", False)
    for path in (
        f"{real}/../../auth.json",
        f"{real}/creds.md",
        str(home / "auth.json"),
        f"{real}-other/x.md",
    ):
        text, is_error = await output(path)
        assert is_error and "CREDENTIALS" not in text, path
    text, is_error = await output(f"{real}/pipe.md")
    assert is_error and "not a regular file" in text
