"""How a shell command is split for approval, and how allow/deny rules match (docs/safety.md
"Approvals"): rules are argv prefixes, not string prefixes; an allow rule matches only a
simple command; a deny rule matches any simple command of a compound one; deny wins
under every policy; ``read_only`` ignores allow rules; a frontend that cannot answer gets
the fixed refusal."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.config.approvals import (
    POLICIES,
    ApprovalSettings,
    Policy,
    Rules,
    build_approvals,
)
from magi_code.protocol.v2 import APPROVAL_POLICIES
from magi_code.turns.approvals import (
    CANNOT_APPROVE,
    DENIED,
    READ_ONLY_REFUSAL,
    ApprovalGate,
    NoApprover,
    Subject,
    allowed,
    denied,
    split_command,
)


def command(text: str) -> Subject:
    argv, segments, simple = split_command(text)
    return Subject("command", "shell", argv, segments, simple)


def change(path: str, tool: str = "edit_file") -> Subject:
    return Subject("file_change", tool, path=path)


def rules(*commands: list[str], tools: tuple[str, ...] = (), paths: tuple[str, ...] = ()) -> Rules:
    return Rules(tuple(tuple(c) for c in commands), tools, paths)


# -- splitting ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "segments", "simple"),
    [
        ("git status -s", [["git", "status", "-s"]], True),
        ('git "status"', [["git", "status"]], True),  # quotes are read as the shell does
        ("git status && rm -rf x", [["git", "status"], ["rm", "-rf", "x"]], False),
        ("true; rm -rf x", [["true"], ["rm", "-rf", "x"]], False),
        ("a&&b||c", [["a"], ["b"], ["c"]], False),  # operators without spaces
        ("ls | grep x", [["ls"], ["grep", "x"]], False),
        ("sleep 1 & rm x", [["sleep", "1"], ["rm", "x"]], False),
        ("(rm x)", [["rm", "x"]], False),
        ("echo hi > out", [["echo", "hi"], ["out"]], False),  # a redirection is compound
        ("echo $HOME", [["echo", "$HOME"]], False),  # an expansion is never simple
        ("echo `id`", [["echo", "`id`"]], False),
        ("a\\ b", [["a b"]], False),
        ("git status\nrm x", [["git", "status"], ["rm", "x"]], False),  # a newline separates
        ('echo "a\nb"', [["echo", "a\nb"]], False),  # a quoted one does not
        ("FOO=1 BAR=2 rm -rf x", [["rm", "-rf", "x"]], True),  # assignments are not the command
        ("echo 'unterminated", [["echo 'unterminated"]], False),  # one opaque word
        ("", [], False),
    ],
)
def test_split_command(text: str, segments: list[list[str]], simple: bool) -> None:
    _argv, got, is_simple = split_command(text)
    assert [list(s) for s in got] == segments
    assert is_simple is simple


def test_the_argv_keeps_every_word_and_operator() -> None:
    assert split_command("FOO=1 git status && make")[0] == (
        "FOO=1",
        "git",
        "status",
        "&&",
        "make",
    )


# -- matching -------------------------------------------------------------------------------


def test_command_rules_are_argv_prefixes_not_string_prefixes() -> None:
    rule = rules(["git", "status"])
    assert allowed(command("git status"), rule)
    assert allowed(command("git status -s"), rule)
    assert not allowed(command("git statusx"), rule)
    assert not allowed(command("git stat"), rule)
    assert not allowed(command("gitstatus"), rule)
    assert not allowed(command("git"), rule)
    assert not allowed(command("git log status"), rule)
    assert denied(command("rm -rf x"), rules(["rm"]))
    assert not denied(command("rmdir x"), rules(["rm"]))
    assert not denied(command("echo rm"), rules(["rm"]))


def test_an_allow_rule_matches_only_a_simple_command() -> None:
    rule = rules(["git", "status"])
    for text in (
        "git status && rm -rf x",
        "git status; rm -rf x",
        "git status | sh",
        "git status > .bashrc",
        "git status $(rm -rf x)",
        "git status `rm -rf x`",
        "FOO=1 git status",  # the assignment is part of its argv
    ):
        assert not allowed(command(text), rule), text


def test_a_deny_rule_matches_any_simple_command_of_a_compound_one() -> None:
    rule = rules(["rm"], ["git", "push"])
    for text in (
        "true; rm -rf x",
        "make && rm -rf x",
        "ls | rm x",
        "(rm x)",
        "true && git push --force",
        "FOO=1 rm x",
        "sleep 1 & rm x",
        "true\nrm x",
    ):
        assert denied(command(text), rule), text
    assert not denied(command("git pull && make"), rule)


def test_tool_rules_are_name_patterns_and_path_rules_cover_a_directory_tree() -> None:
    mcp = Subject("mcp_tool", "mcp__docs__search")
    assert allowed(mcp, rules(tools=("mcp__docs__*",)))
    assert not allowed(mcp, rules(tools=("mcp__doc",)))
    assert denied(command("ls"), rules(tools=("shell",)))
    covering = rules(paths=("docs",))
    assert allowed(change("docs/a.md"), covering)
    assert allowed(change("docs/deep/b.md"), covering)
    assert not allowed(change("docsx/a.md"), covering)
    assert denied(change(".github/workflows/ci.yml"), rules(paths=(".github/",)))
    assert allowed(change("src/a.py"), rules(paths=("src/*.py",)))
    # Path rules are about file changes, not what a command touches.
    assert not denied(command("rm docs/a.md"), rules(paths=("docs",)))


# -- the verdict ----------------------------------------------------------------------------


class Asking(NoApprover):
    can_ask = True  # type: ignore[assignment]

    def __init__(self, granted: Rules | None = None) -> None:
        self.granted = granted or Rules()

    def session_rules(self) -> Rules:
        return self.granted


def verdict(policy: Policy, call: Subject, approver: Any = None, **settings: Any) -> str:
    gate = ApprovalGate(
        ApprovalSettings(policy=policy, **settings),
        approver or Asking(),
        launch=None,  # type: ignore[arg-type]  # not used by the verdict
        sink=None,  # type: ignore[arg-type]
        turn_id="t",
    )
    return gate.verdict(call)


def test_deny_wins_under_every_policy_and_over_an_allow_rule() -> None:
    both = {"allow": rules(["rm"]), "deny": rules(["rm"])}
    for policy in ("auto", "ask", "read_only"):
        assert verdict(policy, command("rm x"), **both) == DENIED
    granted = Asking(rules(["rm", "x"]))
    assert verdict("ask", command("rm x"), granted, deny=rules(["rm"])) == DENIED


def test_the_policies() -> None:
    call = command("make install")
    assert verdict("auto", call) == "run"
    assert verdict("ask", call) == "ask"
    assert verdict("ask", call, allow=rules(["make"])) == "run"
    assert verdict("ask", call, Asking(rules(["make", "install"]))) == "run"  # a session grant
    assert verdict("ask", call, Asking(rules(["make", "test"]))) == "ask"
    # read_only refuses even what an allow rule names.
    assert verdict("read_only", call, allow=rules(["make"])) == READ_ONLY_REFUSAL
    # A frontend that cannot answer: refused at once, unless a rule allows it.
    assert verdict("ask", call, NoApprover()) == CANNOT_APPROVE
    assert verdict("ask", call, NoApprover(), allow=rules(["make"])) == "run"
    assert verdict("ask", command("make && make install"), allow=rules(["make"])) == "ask"


def test_a_session_may_choose_every_policy_the_settings_know() -> None:
    assert APPROVAL_POLICIES == POLICIES


def test_a_session_policy_is_never_looser_than_an_untrusted_project_asks() -> None:
    mine = {"approval_policy": "ask"}
    untrusted = build_approvals(mine, {"approval_policy": "ask"}, trusted=False)
    assert untrusted.policy_for(None) == "ask"
    assert untrusted.policy_for("auto") == "ask"  # the project tightened: it stays so
    assert untrusted.policy_for("read_only") == "read_only"
    # The user's own settings (global, a trusted project's) a session may loosen.
    assert build_approvals(mine, {}, trusted=False).policy_for("auto") == "auto"
    trusted = build_approvals(mine, {"approval_policy": "read_only"}, trusted=True)
    assert trusted.policy_for("auto") == "auto"
