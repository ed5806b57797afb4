"""Approval settings: the policy, allow/deny rules and the answer deadline, from both files.

``approval_policy`` is ``auto`` (every tool call runs), ``ask`` (calls that write or execute
wait for a person's answer) or ``read_only`` (those calls are refused). ``approval_rules``
holds ``allow`` and ``deny`` lists of shell command prefixes (argv words), tool names
(fnmatch patterns) and project paths (fnmatch patterns relative to the project; a pattern
also covers everything under the directory it names).

The project file arrives with the repository, so it may only tighten by itself: its
policy counts when it is stricter than the global one and its deny rules always count,
but its looser policy and its allow rules (where "allow always for this project" answers
are written) count only in a project the global ``trusted_projects`` names. A session
may choose its own policy (RFC-0002 §6.7 ``approval_policy``), looser or stricter than the
settings', but never looser than an untrusted project's file asks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from magi_code.dataclass import dataclass

Policy = Literal["auto", "ask", "read_only"]
# Loosest first; the v2 ``approval_policy`` frame takes the same (protocol.v2, tested).
POLICIES: Final[tuple[Policy, ...]] = ("auto", "ask", "read_only")
DEFAULT_TIMEOUT_SECONDS: Final = 600
MAX_TIMEOUT_SECONDS: Final = 86_400
# Settings keys of this module (a project's looser values need trust, as TRUST_GATED).
APPROVAL_KEYS: Final = ("approval_policy", "approval_rules", "approval_timeout_seconds")

_WORD: Final[dict[str, Any]] = {"type": "string", "pattern": r"^[^\x00]*$", "maxLength": 4096}
_RULES: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "commands": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "array", "minItems": 1, "maxItems": 64, "items": _WORD},
            "description": 'Command prefixes as argv words: ["git", "status"].',
        },
        "tools": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "string", "minLength": 1, "maxLength": 256},
            "description": 'Tool names (fnmatch patterns), e.g. "mcp__docs__*".',
        },
        "paths": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "string", "minLength": 1, "maxLength": 4096},
            "description": "Project-relative path patterns (fnmatch; a directory covers its tree).",
        },
    },
}
# The settings schema's entries (config.schema merges them in).
SCHEMA_PROPERTIES: Final[dict[str, Any]] = {
    "approval_policy": {
        "type": "string",
        "enum": list(POLICIES),
        "description": (
            "auto: every tool call runs; ask: shell commands, file writes and MCP tools not "
            "declared read-only wait for a person's answer (a v1 frontend cannot answer: "
            "refused); read_only: those calls are refused. A project file may only make it "
            "stricter unless the project is trusted."
        ),
    },
    "approval_rules": {
        "type": "object",
        "description": (
            "allow/deny rules; deny wins. A project's allow rules count only when the "
            "project is trusted."
        ),
        "properties": {"allow": _RULES, "deny": _RULES},
    },
    "approval_timeout_seconds": {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_TIMEOUT_SECONDS,
        "description": "How long a call waits for an answer before it is rejected (600).",
    },
}


@dataclass(frozen=True, slots=True)
class Rules:
    commands: tuple[tuple[str, ...], ...] = ()
    tools: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

    def __add__(self, other: Rules) -> Rules:
        return Rules(
            self.commands + other.commands, self.tools + other.tools, self.paths + other.paths
        )

    def changed(self, kind: str, value: tuple[str, ...] | str, *, add: bool) -> Rules:
        """These rules with one rule of ``kind`` (``commands``/``tools``/``paths``) added
        or removed."""
        entries: tuple[Any, ...] = getattr(self, kind)
        kept = tuple(entry for entry in entries if entry != value)
        return dataclasses.replace(self, **{kind: (*kept, value) if add else kept})

    def __bool__(self) -> bool:
        return bool(self.commands or self.tools or self.paths)

    def as_document(self) -> dict[str, list[Any]]:
        return {
            "commands": [list(argv) for argv in self.commands],
            "tools": list(self.tools),
            "paths": list(self.paths),
        }


@dataclass(frozen=True, slots=True)
class ApprovalSettings:
    policy: Policy = "auto"
    allow: Rules = Rules()
    deny: Rules = Rules()
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    # The project's allow rules count (it is trusted): "allow always" may be offered.
    project_allows: bool = False
    # The loosest policy a session's own choice may have: what an untrusted project's
    # file tightened to (a trusted project's, and the global file, are the user's own).
    floor: Policy = "auto"

    def policy_for(self, session_choice: Policy | None) -> Policy:
        """The policy of a session that chose ``session_choice`` (None: the settings')."""
        if session_choice is None:
            return self.policy
        return max(session_choice, self.floor, key=POLICIES.index)


def rules(document: Mapping[str, Any], side: str) -> Rules:
    """One side (``allow``/``deny``) of a validated document's ``approval_rules``."""
    raw = document.get("approval_rules", {}).get(side, {})
    return Rules(
        tuple(tuple(argv) for argv in raw.get("commands", ())),
        tuple(raw.get("tools", ())),
        tuple(raw.get("paths", ())),
    )


def stored_rules(document: object) -> Rules:
    """Rules from a document ``Rules.as_document`` wrote and something stored (a
    session's grants): entries of the wrong shape are left out, never trusted."""
    if not isinstance(document, dict):
        return Rules()

    def strings(value: object) -> list[str]:
        return [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []

    commands = document.get("commands")
    return Rules(
        tuple(
            tuple(argv)
            for argv in (commands if isinstance(commands, list) else ())
            if isinstance(argv, list) and argv and strings(argv) == argv
        ),
        tuple(strings(document.get("tools"))),
        tuple(strings(document.get("paths"))),
    )


def build_approvals(
    global_doc: Mapping[str, Any], project_doc: Mapping[str, Any], *, trusted: bool
) -> ApprovalSettings:
    """The approval settings of two validated documents (see the module docstring)."""
    mine: Policy = global_doc.get("approval_policy", "auto")
    theirs: Policy | None = project_doc.get("approval_policy")
    if theirs is None:
        policy = mine
    elif trusted:
        policy = theirs
    else:
        policy = max(mine, theirs, key=POLICIES.index)
    timeout = project_doc.get("approval_timeout_seconds") if trusted else None
    return ApprovalSettings(
        policy=policy,
        allow=rules(global_doc, "allow") + (rules(project_doc, "allow") if trusted else Rules()),
        deny=rules(global_doc, "deny") + rules(project_doc, "deny"),
        timeout_seconds=timeout
        or global_doc.get("approval_timeout_seconds", DEFAULT_TIMEOUT_SECONDS),
        project_allows=trusted,
        floor="auto" if trusted or theirs is None else theirs,
    )


def add_allow_rule(document: dict[str, Any], kind: str, value: Sequence[str] | str) -> None:
    """Add one allow rule (``commands``/``tools``/``paths``) to a settings document."""
    table = document.setdefault("approval_rules", {}).setdefault("allow", {})
    entries = table.setdefault(kind, [])
    entry = list(value) if kind == "commands" else value
    if entry not in entries:
        entries.append(entry)


def remove_rule(document: dict[str, Any], side: str, kind: str, value: Sequence[str] | str) -> bool:
    """Remove one rule from a settings document; whether it was there."""
    table = document.get("approval_rules", {}).get(side, {})
    entries = table.get(kind, [])
    entry = list(value) if kind == "commands" else value
    if entry not in entries:
        return False
    entries.remove(entry)
    return True
