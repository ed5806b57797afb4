"""Tool-call approvals: which calls need a person's answer, and what the turn does with it.

Theory of operation: the turn wraps every tool in :class:`GatedTool` (inside the hooks, so
a blocking ``pre_tool_use`` hook decides first). A call is classified (:func:`subject`):
shell commands (``command``), file writes and edits (``file_change``) and MCP tools their
server does not declare read-only (``mcp_tool``) need approval; every other call runs.
:meth:`ApprovalGate.verdict` applies the settings (``config.approvals``; with the policy
the session chose, if it did, within what the project allows): a deny rule refuses,
``auto`` runs, an allow rule (the settings', a trusted project's, or one this session was
granted) runs, ``read_only`` refuses, and ``ask`` asks the turn's
:class:`Approver`. A frontend that cannot answer (v1) gets :data:`CANNOT_APPROVE` at once;
a persistent one gets a request and the call waits for the first answer, the deadline, or
the turn's end. Every refusal is a tool error the model sees; the turn goes on, except
after ``reject_and_stop``.

Allow rules for commands match only a *simple* command (no shell operators, expansions
or redirections), by argv prefix; deny rules match any simple command of a compound one.
"""

from __future__ import annotations

import asyncio
import difflib
import fnmatch
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from magi_code.config.approvals import ApprovalSettings, Policy, Rules, add_allow_rule
from magi_code.config.settings import Scope, update_settings
from magi_code.dataclass import dataclass
from magi_code.protocol.text import redact_secrets, truncate_utf8
from magi_code.protocol.v2 import APPROVAL_CANCELLED, APPROVAL_DECISIONS, APPROVAL_TIMED_OUT
from magi_code.storage.launch import LaunchContext
from magi_code.tools.base import Tool, ToolContext, ToolInputError, ToolOutcome, WrappedTool
from magi_code.tools.paths import display_path, project_root, resolve_in_project

from . import activity
from .agent import TOOL_CALL_ACTIVITY

# The kinds of request (``v2.APPROVAL_KINDS``; a test ties the two).
Kind = Literal["command", "file_change", "mcp_tool"]
# Every answer, and what a request settles as without one.
DECISIONS: Final = APPROVAL_DECISIONS
TIMED_OUT: Final = APPROVAL_TIMED_OUT
CANCELLED: Final = APPROVAL_CANCELLED

# What the model sees for a call that did not run (fixed texts).
CANNOT_APPROVE: Final = "needs approval: this frontend cannot approve"
READ_ONLY_REFUSAL: Final = "refused: the approval policy is read_only"
DENIED: Final = "refused by an approval rule"
REJECTED: Final = "rejected by the user"
REJECTED_AND_STOPPED: Final = "rejected by the user; the turn is stopped"
TIMED_OUT_REFUSAL: Final = "rejected: no answer before the approval deadline"

# A request's summary is bounded: the diff to this many bytes, each argv word and the
# command text to MAX_WORD_BYTES.
MAX_DIFF_BYTES: Final = 64 * 1024
MAX_WORD_BYTES: Final = 4096
MAX_SUMMARY_WORDS: Final = 256
# A file larger than this is not read for the diff (the summary says so).
MAX_DIFF_SOURCE_BYTES: Final = 4 * 1024 * 1024
# Shell tokens that make a command compound (shlex punctuation) or expand something.
_OPERATOR_CHARS: Final = "();<>|&\n"
_EXPANSION_CHARS: Final = ("$", "`", "\n", "\\")
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")

WRITE_TOOLS: Final = frozenset({"write_file", "edit_file"})
SHELL_TOOL: Final = "shell"


@dataclass(frozen=True, slots=True)
class Subject:
    """What a call would do, as far as approval is concerned."""

    kind: Kind
    tool_name: str
    argv: tuple[str, ...] = ()
    segments: tuple[tuple[str, ...], ...] = ()  # the simple commands of a shell command
    simple: bool = False  # the whole command is one simple command (argv)
    path: str | None = None  # project-relative, for file changes
    summary: Mapping[str, Any] | None = None

    def rule(self) -> tuple[str, tuple[str, ...] | str]:
        """The allow rule an "allow for this session/project" answer adds: the exact
        argv of a simple command, the exact path, or the tool name."""
        if self.kind == "command" and self.simple:
            return "commands", self.argv
        if self.kind == "file_change" and self.path is not None:
            return "paths", self.path
        return "tools", self.tool_name


@dataclass(frozen=True, slots=True)
class ApprovalAsk:
    """One request for a person's answer (transport-neutral)."""

    kind: Kind
    summary: Mapping[str, Any]
    options: tuple[str, ...]
    activity_id: str | None = None  # the tool call's activity (its ``turn.activity`` item)


class Approver(Protocol):
    """The turn's way to a person (the core implements it per connection)."""

    @property
    def can_ask(self) -> bool:
        """Whether the turn's frontend can answer approval requests."""

    def session_rules(self) -> Rules:
        """The allow rules this session was granted."""

    def session_policy(self) -> Policy | None:
        """The policy this session chose, if it chose one (read at every call)."""

    async def grant_session(self, kind: str, value: tuple[str, ...] | str) -> None:
        """Remember an "allow for this session" answer (stored with the session)."""

    async def ask(self, request: ApprovalAsk, timeout: float) -> str:
        """The first answer (one of :data:`DECISIONS`), or :data:`TIMED_OUT`."""

    def stop_turn(self) -> None:
        """``reject_and_stop``: end the turn (cancelled)."""


class NoApprover:
    """A frontend that cannot answer (v1, or a persistent client that did not ask for
    approvals): calls that need an answer are refused."""

    can_ask = False

    def session_rules(self) -> Rules:
        return Rules()

    def session_policy(self) -> Policy | None:
        return None

    async def grant_session(self, kind: str, value: tuple[str, ...] | str) -> None:
        raise AssertionError("nothing is granted without asking")

    async def ask(self, request: ApprovalAsk, timeout: float) -> str:
        raise AssertionError("never asked")

    def stop_turn(self) -> None:
        raise AssertionError("never asked")


class ActivitySink(Protocol):
    def activity(self, payload: dict[str, Any]) -> None: ...


# -- classification ---------------------------------------------------------------------


def split_command(command: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...], bool]:
    """``(argv, simple commands, simple)`` of a shell command line, as far as ``shlex``
    reads it; unparsable text is one opaque word (never simple). A simple command's
    leading variable assignments (``FOO=1 rm x``) are left out of it, so deny rules see
    the command that runs; ``argv`` keeps them (an allow rule then does not match)."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=_OPERATOR_CHARS)
        lexer.whitespace = " \t\r"  # an unquoted newline separates commands, like ";"
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return (command,), ((command,),), False
    segments: list[tuple[str, ...]] = []
    current: list[str] = []
    compound = False
    for token in tokens:
        if token and set(token) <= set(_OPERATOR_CHARS):
            compound = True
            if current:
                segments.append(tuple(current))
            current = []
        elif current or not _ASSIGNMENT.match(token):
            current.append(token)
    if current:
        segments.append(tuple(current))
    simple = not compound and not any(c in command for c in _EXPANSION_CHARS)
    return tuple(tokens), tuple(segments), simple and bool(tokens)


def subject(tool: Tool, arguments: Mapping[str, object], ctx: ToolContext) -> Subject | None:
    """What approval needs to know of a call, or None when it needs none. Blocking (a
    file change reads the file for its diff)."""
    name = tool.name
    server = getattr(tool, "server_name", None)
    if server is not None:
        if getattr(tool, "declared_read_only", False) is True:
            return None
        summary = {"server": server, "tool": getattr(tool, "tool_name", name)}
        return Subject("mcp_tool", name, summary=summary)
    if name == SHELL_TOOL:
        command = arguments.get("command")
        if not isinstance(command, str) or not command:
            return None  # the tool refuses it itself
        argv, segments, simple = split_command(command)
        shown = [_bounded(word) for word in argv[:MAX_SUMMARY_WORDS]]
        summary = {
            "argv": shown,
            "command": _bounded(command),
            "truncated": len(argv) > MAX_SUMMARY_WORDS or any(_cut(w) for w in argv),
        }
        return Subject("command", name, argv, segments, simple, summary=summary)
    if name in WRITE_TOOLS:
        return _file_change(name, arguments, ctx)
    return None


def _file_change(name: str, arguments: Mapping[str, object], ctx: ToolContext) -> Subject | None:
    raw = arguments.get("path")
    if not isinstance(raw, str) or not raw:
        return None  # the tool refuses it itself
    try:
        root = project_root(ctx.project_dir)
        path = resolve_in_project(root, raw)
    except ToolInputError:
        return None  # outside the project: the tool refuses it without writing
    shown = display_path(root, path)
    before = _read_text(path)
    if name == "write_file":
        content = arguments.get("content")
        after = content if isinstance(content, str) else None
    else:
        old, new = arguments.get("old_string"), arguments.get("new_string")
        after = None
        if before is not None and isinstance(old, str) and isinstance(new, str) and old:
            every = arguments.get("replace_all") is True
            after = before.replace(old, new) if every else before.replace(old, new, 1)
    diff = ""
    if after is not None:
        lines = difflib.unified_diff(
            (before or "").splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{shown}" if before is not None else "/dev/null",
            tofile=f"b/{shown}",
        )
        diff = redact_secrets("".join(lines))
    text, truncated = truncate_utf8(diff, MAX_DIFF_BYTES)
    summary = {"path": shown, "diff": text, "truncated": truncated or after is None}
    return Subject("file_change", name, path=shown, summary=summary)


def _read_text(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_DIFF_SOURCE_BYTES:
            return None
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _bounded(word: str) -> str:
    return truncate_utf8(redact_secrets(word), MAX_WORD_BYTES)[0]


def _cut(word: str) -> bool:
    return len(word.encode("utf-8", "surrogatepass")) > MAX_WORD_BYTES


# -- rules --------------------------------------------------------------------------------


def _path_matches(path: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, f"{pattern}/*"):
            return True
    return False


def _prefix(argv: Sequence[str], prefixes: Sequence[Sequence[str]]) -> bool:
    return any(tuple(argv[: len(p)]) == tuple(p) for p in prefixes)


def denied(call: Subject, rules: Rules) -> bool:
    if any(fnmatch.fnmatchcase(call.tool_name, p) for p in rules.tools):
        return True
    if call.kind == "command":
        return any(_prefix(segment, rules.commands) for segment in call.segments)
    return call.path is not None and _path_matches(call.path, rules.paths)


def allowed(call: Subject, rules: Rules) -> bool:
    if any(fnmatch.fnmatchcase(call.tool_name, p) for p in rules.tools):
        return True
    if call.kind == "command":
        return call.simple and _prefix(call.argv, rules.commands)
    return call.path is not None and _path_matches(call.path, rules.paths)


# -- the gate ----------------------------------------------------------------------------


class ApprovalGate:
    """One turn's approval settings and approver."""

    def __init__(
        self,
        settings: ApprovalSettings,
        approver: Approver,
        launch: LaunchContext,
        sink: ActivitySink,
        turn_id: str,
    ) -> None:
        self.settings = settings
        self.approver = approver
        self.launch = launch
        self.sink = sink
        self.turn_id = turn_id
        self._asked = 0

    def wrap(self, tools: Sequence[Tool]) -> list[Tool]:
        # Wrapped even under auto: the session may choose another policy mid-turn.
        return [GatedTool(tool, self) for tool in tools]

    @property
    def policy(self) -> Policy:
        return self.settings.policy_for(self.approver.session_policy())

    @property
    def checks(self) -> bool:
        """Whether a call needs looking at (not: auto and no deny rule)."""
        return self.policy != "auto" or bool(self.settings.deny)

    def verdict(self, call: Subject) -> Literal["run", "ask"] | str:
        """``run``, ``ask``, or the refusal text."""
        settings = self.settings
        policy = self.policy
        if denied(call, settings.deny):
            return DENIED
        if policy == "auto":
            return "run"
        if policy == "read_only":
            return READ_ONLY_REFUSAL
        if allowed(call, settings.allow) or allowed(call, self.approver.session_rules()):
            return "run"
        return "ask" if self.approver.can_ask else CANNOT_APPROVE

    async def check(self, call: Subject) -> str | None:
        """None when the call may run, else the refusal the model sees."""
        verdict = self.verdict(call)
        if verdict == "run":
            return None
        if verdict != "ask":
            return verdict
        options = tuple(
            d for d in DECISIONS if d != "allow_project" or self.settings.project_allows
        )
        assert call.summary is not None
        self._asked += 1
        waiting = activity.identity("approval", self.turn_id, str(self._asked))
        tool_call = TOOL_CALL_ACTIVITY.get()
        self.sink.activity(activity.lifecycle(waiting, "tool", "queued", tool_call))
        try:
            decision = await self.approver.ask(
                ApprovalAsk(call.kind, call.summary, options, tool_call),
                self.settings.timeout_seconds,
            )
        except asyncio.CancelledError:
            self.sink.activity(activity.lifecycle(waiting, "activity", "cancelled"))
            raise
        allowed_now = decision.startswith("allow")
        self.sink.activity(
            activity.lifecycle(waiting, "activity", "completed" if allowed_now else "failed")
        )
        if decision == "allow_session":
            await self.approver.grant_session(*call.rule())
        elif decision == "allow_project":
            await self._persist(call)
        elif decision == "reject_and_stop":
            self.approver.stop_turn()
            return REJECTED_AND_STOPPED
        elif decision == TIMED_OUT:
            return TIMED_OUT_REFUSAL
        return None if allowed_now else REJECTED

    async def _persist(self, call: Subject) -> None:
        """ "Allow always for this project": a rule in the project settings file (through
        the one checked writer), honoured by the project's next turns. The call runs even
        when the write fails; the next turn then asks again."""
        kind, value = call.rule()
        try:
            await asyncio.to_thread(
                update_settings,
                self.launch,
                Scope.PROJECT,
                lambda _current, document: add_allow_rule(document, kind, value),
            )
        except Exception:  # noqa: BLE001 - ServiceError or OSError: the call still runs
            await self.approver.grant_session(kind, value)


class GatedTool(WrappedTool):
    """A tool whose calls pass the turn's :class:`ApprovalGate` first."""

    def __init__(self, tool: Tool, gate: ApprovalGate) -> None:
        super().__init__(tool)
        self._gate = gate

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        if not self._gate.checks:
            return await self._tool.run(arguments, ctx)
        call = await asyncio.to_thread(subject, self._tool, arguments, ctx)
        if call is not None:
            refusal = await self._gate.check(call)
            if refusal is not None:
                return ToolOutcome.error(refusal)
        return await self._tool.run(arguments, ctx)
