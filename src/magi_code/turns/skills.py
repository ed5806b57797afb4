"""Skills: folders of task instructions in the open Agent Skills layout.

Theory of operation: a skill is a directory ``<name>/`` holding ``SKILL.md``, a YAML front
matter block with ``name`` and ``description`` followed by a Markdown body, and any files
beside it. Skills are found in ``<project>/.magi-code/skills/`` and ``$MC_HOME/skills/``;
on a name clash the project's wins. Names and descriptions go into the system prompt; the
model loads a body on demand with the ``skill`` tool, and reads the sibling files with the
file tools (``read_file`` is given the folders of ``$MC_HOME`` skills, see
:class:`SkillReadFile`).

Skills are startup resources: :class:`SkillCache` discovers them the first time a turn of
a launch context (the embedded service's one, or one daemon connection's) needs them and
keeps that catalog, bodies included, for every later turn of that context. A changed skill
is picked up by the next service process or daemon connection.

Everything read is bounded and confined: at most :data:`MAX_SCANNED_ENTRIES` directory
entries per root, :data:`MAX_SKILLS` skills, :data:`MAX_SKILL_FILE_BYTES` per ``SKILL.md``;
skill directories and ``SKILL.md`` are opened without following symlinks and without
blocking (a FIFO is refused), and the project's skills root must resolve inside the
project. A skill that breaks a rule is skipped, never truncated or guessed at.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from magi_code.dataclass import dataclass
from magi_code.storage.files import open_regular
from magi_code.storage.launch import PROJECT_CONFIG_DIR, LaunchContext, inside_project
from magi_code.tools.base import Tool, ToolContext, ToolOutcome

from . import activity

log = logging.getLogger(__name__)

SKILL_TOOL_NAME: Final = "skill"
SKILL_FILE: Final = "SKILL.md"
PROJECT_SKILLS_DIR: Final = PROJECT_CONFIG_DIR / "skills"
HOME_SKILLS_DIR: Final = "skills"

MAX_SKILLS: Final = 32
MAX_SCANNED_ENTRIES: Final = 1024
MAX_SKILL_FILE_BYTES: Final = 24 * 1024
MAX_NAME_CHARS: Final = 64
MAX_DESCRIPTION_CHARS: Final = 1024
# Sibling files listed by the skill tool (regular files, at most this deep).
MAX_LISTED_FILES: Final = 64
MAX_LISTED_DEPTH: Final = 3
# Launch contexts whose catalogs the cache keeps (a daemon serves many connections).
MAX_CACHED_CONTEXTS: Final = 64

NAME_PATTERN: Final = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_KEY: Final = re.compile(r"([A-Za-z0-9_-]+):(?:[ \t]+(.*))?")
_BLOCK_SCALAR: Final = re.compile(r"([|>])([+-]?)")

Scope = Literal["project", "home"]


class SkillFileError(ValueError):
    """``SKILL.md`` does not follow the supported layout (the message says how)."""


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str
    body: str
    scope: Scope
    # The folder's real path, and how the model names it: relative to the project for a
    # project skill, absolute for a home skill.
    directory: Path
    shown_directory: str


@dataclass(frozen=True, slots=True)
class SkillCatalog:
    """The skills of one launch context, by name (sorted)."""

    skills: Mapping[str, Skill] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.skills)

    def home_directories(self) -> tuple[Path, ...]:
        return tuple(s.directory for s in self.skills.values() if s.scope == "home")


# -- SKILL.md ------------------------------------------------------------------------------


def parse_skill_file(text: str) -> tuple[dict[str, str], str]:
    """The front matter's top-level ``key: value`` pairs and the body of ``SKILL.md``.

    The supported subset of YAML: the file starts with a ``---`` line and the front matter
    ends at the next ``---`` line. Inside, blank lines and ``#`` comments are skipped, and
    each top-level line is ``key: value`` with a plain value (a `` #`` starts a comment),
    a single-quoted one (``''`` is a quote), a double-quoted one (JSON escapes), or a
    ``|``/``>`` block scalar (the more-indented lines below; ``>`` joins them with
    spaces). Indented lines of other keys (nested maps or lists) are skipped. A repeated
    key or any other line is an error.

    Raises:
        SkillFileError: the text does not follow this layout.
    """
    lines = [line.removesuffix("\r") for line in text.removeprefix("\ufeff").split("\n")]
    if not lines or lines[0].rstrip() != "---":
        raise SkillFileError("no front matter")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].rstrip() == "---")
    except StopIteration:
        raise SkillFileError("unterminated front matter") from None
    fields: dict[str, str] = {}
    block = lines[1:end]
    index = 0
    while index < len(block):
        line = block[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#") or line[0] in " \t":
            continue
        match = _KEY.fullmatch(line.rstrip())
        if match is None:
            raise SkillFileError("a line is not 'key: value'")
        key, raw = match.group(1), (match.group(2) or "").strip()
        if key in fields:
            raise SkillFileError("a key is repeated")
        scalar = _BLOCK_SCALAR.fullmatch(raw.split(" #", 1)[0].strip())
        if scalar is not None:
            continued: list[str] = []
            while index < len(block) and (not block[index].strip() or block[index][0] in " \t"):
                continued.append(block[index])
                index += 1
            fields[key] = _block_scalar(continued, folded=scalar.group(1) == ">")
        else:
            fields[key] = _scalar(raw)
    return fields, "\n".join(lines[end + 1 :]).strip()


def _scalar(raw: str) -> str:
    if raw.startswith('"'):
        end = _closing_double_quote(raw)
        try:
            value = json.loads(raw[: end + 1])
        except ValueError:
            raise SkillFileError("a double-quoted value is invalid") from None
        _only_comment(raw[end + 1 :])
        assert isinstance(value, str)
        return value
    if raw.startswith("'"):
        index = 1
        parts: list[str] = []
        while True:
            quote = raw.find("'", index)
            if quote == -1:
                raise SkillFileError("a single-quoted value is not closed")
            parts.append(raw[index:quote])
            if raw.startswith("''", quote):
                parts.append("'")
                index = quote + 2
                continue
            _only_comment(raw[quote + 1 :])
            return "".join(parts)
    value = raw.split(" #", 1)[0].strip()
    return "" if value == "#" or value.startswith("# ") else value


def _closing_double_quote(raw: str) -> int:
    index = 1
    while index < len(raw):
        if raw[index] == "\\":
            index += 2
            continue
        if raw[index] == '"':
            return index
        index += 1
    raise SkillFileError("a double-quoted value is not closed")


def _only_comment(rest: str) -> None:
    rest = rest.strip()
    if rest and not rest.startswith("#"):
        raise SkillFileError("text follows a quoted value")


def _block_scalar(lines: Sequence[str], *, folded: bool) -> str:
    content = [line for line in lines if line.strip()]
    indent = min((len(line) - len(line.lstrip(" \t")) for line in content), default=0)
    texts = [line[indent:].rstrip() for line in lines]
    while texts and not texts[-1]:
        texts.pop()
    if not folded:
        return "\n".join(texts)
    paragraphs: list[str] = []
    current: list[str] = []
    for text in texts:
        if text:
            current.append(text)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(paragraphs)


def skill_from_text(text: str, directory_name: str) -> tuple[str, str, str]:
    """``(name, description, body)`` of a ``SKILL.md`` in directory ``directory_name``.

    Raises:
        SkillFileError: the layout is unsupported, ``name`` is missing, invalid (1-64
            characters of ``a-z``, ``0-9`` and single inner hyphens) or not the directory's
            name, or ``description`` is missing, empty or over 1024 characters.
    """
    fields, body = parse_skill_file(text)
    name = fields.get("name", "")
    if name != directory_name or not valid_name(name):
        raise SkillFileError("the name is missing, invalid or not the directory's name")
    description = " ".join(fields.get("description", "").split())
    if not description or len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillFileError("the description is missing or too long")
    return name, description, body


def valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME_CHARS and NAME_PATTERN.fullmatch(name) is not None


# -- discovery -----------------------------------------------------------------------------


def discover_skills(project_dir: Path, mc_home: Path) -> SkillCatalog:
    """Every usable skill of the project and the home, project first. Blocking; never
    raises for what is on disk."""
    found: dict[str, Skill] = {}
    roots: list[tuple[Path, Scope, Path | None]] = []
    project_root = inside_project(project_dir, PROJECT_SKILLS_DIR)
    if project_root is None:
        log.info("the project's skills directory leads out of the project; it is skipped")
    else:
        roots.append((project_root, "project", Path(os.path.realpath(project_dir))))
    roots.append((mc_home / HOME_SKILLS_DIR, "home", None))
    for root, scope, project in roots:
        for skill in _scan(root, scope, project):
            if len(found) >= MAX_SKILLS:
                break
            found.setdefault(skill.name, skill)
    return SkillCatalog(dict(sorted(found.items())))


def _scan(root: Path, scope: Scope, project: Path | None) -> list[Skill]:
    """The valid skills directly under ``root``, by name. ``project``: the real project
    directory, which a project skill is shown relative to."""
    try:
        real_root = Path(os.path.realpath(root))
    except (OSError, ValueError):
        return []
    try:
        root_fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        names: list[str] = []
        with os.scandir(root_fd) as entries:
            for entry in itertools.islice(entries, MAX_SCANNED_ENTRIES):
                if valid_name(entry.name):
                    names.append(entry.name)
        skills: list[Skill] = []
        for name in sorted(names):
            if len(skills) >= MAX_SKILLS:
                break
            skill = _load(root_fd, real_root, name, scope, project)
            if skill is not None:
                skills.append(skill)
        return skills
    except OSError:
        return []
    finally:
        os.close(root_fd)


def _load(
    root_fd: int, real_root: Path, name: str, scope: Scope, project: Path | None
) -> Skill | None:
    try:
        # A symlinked skill directory is refused (ELOOP/ENOTDIR), like a FIFO or a file.
        dir_fd = os.open(
            name,
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=root_fd,
        )
    except OSError:
        return None
    try:
        data = _read_bounded(dir_fd)
    except OSError:
        return None  # missing, a symlink, a FIFO or another special file
    finally:
        os.close(dir_fd)
    problem: str | None = None
    if len(data) > MAX_SKILL_FILE_BYTES:
        problem = f"its SKILL.md is larger than {MAX_SKILL_FILE_BYTES} bytes"
    else:
        try:
            text = data.decode("utf-8")
            if "\0" in text:
                raise SkillFileError("SKILL.md holds NUL bytes")
            _, description, body = skill_from_text(text, name)
        except UnicodeDecodeError:
            problem = "its SKILL.md is not UTF-8"
        except SkillFileError as exc:
            problem = str(exc)
    if problem is not None:
        log.info("a %s skill is skipped: %s", scope, problem)
        return None
    directory = real_root / name
    shown = str(directory) if project is None else directory.relative_to(project).as_posix()
    return Skill(name, description, body, scope, directory, shown)


def _read_bounded(dir_fd: int) -> bytes:
    """At most ``MAX_SKILL_FILE_BYTES + 1`` bytes of ``SKILL.md`` (regular files only)."""
    fd = open_regular(SKILL_FILE, os.O_RDONLY, dir_fd=dir_fd)
    try:
        chunks: list[bytes] = []
        remaining = MAX_SKILL_FILE_BYTES + 1
        while remaining > 0 and (chunk := os.read(fd, remaining)):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class SkillCache:
    """Catalogs per launch context, discovered once, on the first turn that needs one.

    Keyed by the context object (each daemon connection has its own; the embedded service
    has one), which the entry holds so that its id cannot be reused meanwhile. The least
    recently used entry beyond :data:`MAX_CACHED_CONTEXTS` is dropped; such a context
    discovers its skills again on its next turn.
    """

    def __init__(self, limit: int = MAX_CACHED_CONTEXTS) -> None:
        self._limit = limit
        self._entries: collections.OrderedDict[
            int, tuple[LaunchContext, asyncio.Future[SkillCatalog]]
        ] = collections.OrderedDict()

    async def catalog(self, ctx: LaunchContext) -> SkillCatalog:
        key = id(ctx)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is ctx:
            self._entries.move_to_end(key)
            future = entry[1]
        else:
            future = asyncio.ensure_future(
                asyncio.to_thread(discover_skills, ctx.project_dir, ctx.mc_home)
            )
            self._entries[key] = (ctx, future)
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)
        # Shielded: a cancelled turn leaves the discovery to finish for the next one.
        return await asyncio.shield(future)


# -- the system prompt ---------------------------------------------------------------------


def prompt_section(catalog: SkillCatalog) -> str | None:
    """The system prompt's list of skills (names and descriptions), or ``None``."""
    if not catalog:
        return None
    lines = [
        "# Skills",
        "",
        "Skills are instructions for specific tasks. When a task matches a skill's "
        f"description, call the `{SKILL_TOOL_NAME}` tool with the skill's name before you "
        "start, and follow the instructions it returns.",
        "",
    ]
    lines += [f"- {skill.name}: {skill.description}" for skill in catalog.skills.values()]
    return "\n".join(lines)


# -- the tools -----------------------------------------------------------------------------


def skill_files(directory: Path) -> list[str]:
    """Regular files under ``directory`` but ``SKILL.md``, relative, sorted per directory.

    Symlinks are neither listed nor entered; at most :data:`MAX_LISTED_FILES` files, at
    most :data:`MAX_LISTED_DEPTH` levels, :data:`MAX_SCANNED_ENTRIES` entries scanned.
    """
    files: list[str] = []
    pending: list[tuple[Path, str, int]] = [(directory, "", 1)]
    scanned = 0
    while pending and len(files) < MAX_LISTED_FILES:
        path, prefix, depth = pending.pop(0)
        try:
            with os.scandir(path) as iterator:
                entries = sorted(
                    itertools.islice(iterator, MAX_SCANNED_ENTRIES - scanned),
                    key=lambda e: e.name,
                )
        except OSError:
            continue
        scanned += len(entries)
        for entry in entries:
            relative = prefix + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_LISTED_DEPTH and entry.name != ".git":
                        pending.append((Path(entry.path), relative + "/", depth + 1))
                elif entry.is_file(follow_symlinks=False) and relative != SKILL_FILE:
                    files.append(relative)
            except OSError:
                continue
            if len(files) >= MAX_LISTED_FILES:
                break
        if scanned >= MAX_SCANNED_ENTRIES:
            break
    return files


def render_skill(skill: Skill, files: Sequence[str]) -> str:
    """The ``skill`` tool's result: the body, then where the skill's files are."""
    parts = [f'<skill name="{skill.name}">', skill.body or "(This skill has no instructions.)"]
    parts.append("</skill>")
    parts.append(f"Skill folder: {skill.shown_directory}")
    if files:
        parts.append("Files in it (read them with read_file by these paths):")
        parts += [f"- {skill.shown_directory}/{name}" for name in files]
    return "\n".join(parts)


class SkillTool:
    """``skill``: load a skill's instructions by name."""

    name = SKILL_TOOL_NAME

    def __init__(self, catalog: SkillCatalog, on_load: Callable[[], None]) -> None:
        self._catalog = catalog
        self._on_load = on_load
        self.description = (
            "Load the instructions of a skill listed in the system prompt, by its name. "
            "Returns the instructions and the paths of the files that come with the skill."
        )
        self.parameters: Mapping[str, object] = {
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "enum": list(catalog.skills),
                    "description": "The skill's name.",
                }
            },
            "required": ["name"],
            "additionalProperties": False,
        }

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        name = arguments.get("name")
        skill = self._catalog.skills.get(name) if isinstance(name, str) else None
        if skill is None:
            known = ", ".join(self._catalog.skills)
            return ToolOutcome.error(f"Unknown skill. The skills are: {known}.")
        files = await asyncio.to_thread(skill_files, skill.directory)
        self._on_load()
        return ToolOutcome(render_skill(skill, files))


class SkillReadFile:
    """``read_file``, also for files in the folders of ``$MC_HOME`` skills.

    An absolute path inside one of those folders (after normalization, so ``..`` cannot
    leave it) is read by the wrapped tool with that folder as its root: its confinement
    (symlinks resolved, nothing outside the root) applies to the folder as it does to the
    project. Anything else, a FIFO or other special file is refused without opening it.
    Every other path goes to the wrapped tool unchanged. Only reading is widened: the
    write, edit, list and search tools stay confined to the project.
    """

    def __init__(self, inner: Tool, directories: Iterable[Path]) -> None:
        self._inner = inner
        self._directories = tuple(directories)
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        raw = arguments.get("path")
        directory = self._directory_of(raw) if isinstance(raw, str) else None
        if directory is None or not isinstance(raw, str):
            return await self._inner.run(arguments, ctx)
        relative = os.path.relpath(os.path.normpath(raw), directory)
        if await asyncio.to_thread(_is_special, directory / relative):
            return ToolOutcome.error(f"{relative} is not a regular file.")
        # Not the project: neither its editor nor its details apply.
        inner_ctx = dataclasses.replace(ctx, project_dir=directory, editor=None, details=None)
        return await self._inner.run({**arguments, "path": relative}, inner_ctx)

    def _directory_of(self, raw: str) -> Path | None:
        if not raw.startswith("/") or "\0" in raw:
            return None
        target = os.path.normpath(raw)
        for directory in self._directories:
            if target == str(directory) or target.startswith(f"{directory}/"):
                return directory
        return None


def _is_special(path: Path) -> bool:
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False  # the wrapped tool reports what is wrong
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def turn_tools(
    catalog: SkillCatalog,
    builtins: Sequence[Tool],
    emit: Callable[[dict[str, Any]], None],
    turn_id: str,
) -> list[Tool]:
    """``builtins`` for a turn with ``catalog``: ``read_file`` widened to the home skills'
    folders when there are any, and the ``skill`` tool when there is a skill.

    Each load emits one ``lifecycle`` activity with category ``context_injection``.
    """
    if not catalog:
        return list(builtins)
    home = catalog.home_directories()
    tools: list[Tool] = [
        SkillReadFile(tool, home) if home and tool.name == "read_file" else tool
        for tool in builtins
    ]
    count = itertools.count(1)

    def loaded() -> None:
        load_id = activity.identity("skill", turn_id, str(next(count)))
        emit(activity.lifecycle(load_id, "context_injection", "completed"))

    tools.append(SkillTool(catalog, loaded))
    return tools
