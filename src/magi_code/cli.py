"""Command line entry point: ``magi-code --app service``, ``--prompt`` and the commands.

``magi-code --app service`` is recognized before anything else (every frontend session
starts one; see :func:`main`). Everything else goes through one ``argparse`` parser with
a subparser per command, so each command has its own ``--help``, and an unknown command
or a flag where it does not belong is a usage error (exit 2) that names it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

# Options that select a provider, model, credential, theme or session: the v1 contract
# forbids combining any of them (or a subcommand) with ``--app service``.
_EXCLUSIVE_WITH_APP = ("prompt", "provider", "model", "api_key", "theme", "session", "resume")
_PROMPT_ONLY = ("session", "provider", "model", "prompt_json")
_MODE_ENV = "MC_SERVICE_MODE"
_LOGIN_PROVIDERS = ("openai-codex", "anthropic")


def _parser() -> argparse.ArgumentParser:
    import argparse

    from magi_code.version import package_version

    parser = argparse.ArgumentParser(
        prog="magi-code",
        description="magi-code coding agent: the application service and its tools",
        epilog="Run 'magi-code COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"magi-code {package_version()}")
    parser.add_argument(
        "--app",
        choices=["service", "acp"],
        help="run the application service (v1) or the ACP agent on stdio",
    )
    parser.add_argument("--prompt", help="run one turn with this prompt and print the answer")
    parser.add_argument("--provider", help="provider ID for --prompt")
    parser.add_argument("--model", help="model ID for --prompt")
    parser.add_argument("--session", help="continue this session (with --prompt)")
    parser.add_argument(
        "--json",
        dest="prompt_json",
        action="store_true",
        help="with --prompt: write the turn's v1 events as JSONL",
    )
    parser.add_argument("--api-key", dest="api_key", help=argparse.SUPPRESS)
    parser.add_argument("--theme", help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    daemon = commands.add_parser("daemon", help="manage the per-user daemon")
    actions = daemon.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("start", help="start the daemon unless one answers")
    actions.add_parser("stop", help="stop it (turns are cancelled and persisted)")
    actions.add_parser("restart", help="stop it once its turns end, then start one")
    status = actions.add_parser(
        "status",
        help="is it running, and how is it",
        description="Is the daemon of this MC_HOME running, and how is it: pid, build, "
        "socket, log (daemon.log, rotated at 1 MiB or MC_DAEMON_LOG_BYTES, 3 backups), "
        "uptime, resident memory, open fds, threads, child processes by kind (tool, hook, "
        "mcp_server, worker, other) and zombies, connections by role, turns running and "
        "retained, the most output queued for one connection, and sessions held.",
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    run = actions.add_parser("run", help="run in the foreground (for systemd/launchd)")
    run.add_argument("--on-demand", dest="on_demand", action="store_true", help=argparse.SUPPRESS)
    run.add_argument("--ready-fd", dest="ready_fd", type=int, help=argparse.SUPPRESS)
    install = actions.add_parser("install", help="write the systemd/launchd unit")
    install.add_argument("--print", dest="print_unit", action="store_true", help="print only")
    install.add_argument("--force", action="store_true", help="replace a different unit file")
    uninstall = actions.add_parser("uninstall", help="remove the unit install wrote")
    uninstall.add_argument("--force", action="store_true", help="remove it even if not ours")

    login = commands.add_parser("login", help="store credentials in the shared store")
    # Own dests: a subparser's default would overwrite the top-level --provider's.
    login.add_argument(
        "--provider", dest="login_provider", choices=_LOGIN_PROVIDERS, default="openai-codex"
    )
    login.add_argument(
        "--no-browser", dest="no_browser", action="store_true", help="only print the URL"
    )
    logout = commands.add_parser("logout", help="remove a provider's stored credentials")
    logout.add_argument(
        "--provider", dest="login_provider", default="openai-codex", help="provider ID"
    )
    auth = commands.add_parser("auth", help="credential readiness")
    auth_actions = auth.add_subparsers(dest="action", metavar="ACTION", required=True)
    auth_status = auth_actions.add_parser("status", help="which providers are ready")
    auth_status.add_argument("--json", action="store_true", help="print JSON")
    doctor = commands.add_parser(
        "doctor",
        help="check that a turn can run here",
        description="Check that a turn can run here: platform, MC_HOME, daemon (and its "
        "health: over 1024 MiB resident, over 128 child processes or a zombie child warns), "
        "settings, "
        "selection, credentials, MCP servers, and the hooks and skills a turn here gets.",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument(
        "--network",
        action="store_true",
        help="also ask the selected provider for its model list with the credentials "
        "(one authenticated request): a rejected key fails the check",
    )
    sessions = commands.add_parser(
        "sessions",
        help="list, show, rename, archive, fork, rewind or remove the sessions of this MC_HOME",
        description="The sessions of this MC_HOME (every project's), read, changed and removed "
        "through the session store; works whether or not a daemon runs.",
    )
    session_actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    session_list = session_actions.add_parser(
        "list",
        help="sessions not archived, the most recent activity last: ID, last activity "
        "(UTC) and title",
        description="Sessions, least recent activity first. Sessions created before "
        "magi-code recorded their project match no --project.",
    )
    session_list.add_argument("--json", action="store_true", help="print JSON")
    session_list.add_argument(
        "--project", metavar="DIR", help="only sessions created in this project directory"
    )
    session_list.add_argument(
        "--title", metavar="TEXT", help="only sessions whose title contains TEXT (any case)"
    )
    session_list.add_argument("--archived", action="store_true", help="only archived sessions")
    session_show = session_actions.add_parser(
        "show",
        help="a session's conversation as text",
        description="The conversation as replay shows it (messages, and how turns that "
        "did not complete ended), with the agent's tool calls; the recent 2 MiB of history.",
    )
    session_show.add_argument("session_ids", metavar="ID", nargs=1, help="a session ID")
    session_rm = session_actions.add_parser(
        "rm",
        help="remove sessions",
        description="Remove sessions and their history for good. A session a running "
        "magi-code has open (a frontend, a running turn, --prompt) is refused, and so "
        "is one holding files that are not yours.",
    )
    session_rm.add_argument("session_ids", metavar="ID", nargs="+", help="session IDs")
    session_rename = session_actions.add_parser(
        "rename",
        help="give a session a title",
        description="Give a session a title of your own; it replaces the one taken from "
        "the first prompt. Works on a session a running magi-code has open.",
    )
    session_rename.add_argument("session_ids", metavar="ID", nargs=1, help="a session ID")
    session_rename.add_argument("title", metavar="TITLE", help="the new title (80 characters)")
    for name, what in (
        ("archive", "hide sessions from the default lists (nothing is deleted)"),
        ("unarchive", "show archived sessions in the default lists again"),
    ):
        archive = session_actions.add_parser(
            name, help=what, description=what[0].upper() + what[1:] + "."
        )
        archive.add_argument("session_ids", metavar="ID", nargs="+", help="session IDs")
    at_help = "where to go back to: turn:N (after the N-th turn; turn:0 is the start) or a "
    at_help += "session.replay cursor at a turn's end"
    session_fork = session_actions.add_parser(
        "fork",
        help="a new session with a session's history up to a point",
        description="Make a new session whose history is this one's up to AT; prints its ID.",
    )
    session_fork.add_argument("session_ids", metavar="ID", nargs=1, help="a session ID")
    session_fork.add_argument("at", metavar="AT", help=at_help)
    session_rewind = session_actions.add_parser(
        "rewind",
        help="take a session's conversation and the agent's file changes back to a point",
        description="Show what going back to AT would remove from the conversation and "
        "which files the agent changed since would change back; with --yes, do it. A file "
        "changed outside the agent since is left alone unless --force. Refused while a "
        "running magi-code has the session open.",
    )
    session_rewind.add_argument("session_ids", metavar="ID", nargs=1, help="a session ID")
    session_rewind.add_argument("at", metavar="AT", help=at_help)
    session_rewind.add_argument("--yes", action="store_true", help="rewind (else: preview)")
    session_rewind.add_argument(
        "--no-files", action="store_true", help="the conversation only: leave every file"
    )
    session_rewind.add_argument(
        "--force", action="store_true", help="also change back files changed outside the agent"
    )
    grants = commands.add_parser(
        "grants",
        help="list or revoke the approval grants of this project and its sessions",
        description="Approval grants (docs/safety.md): project grants are the allow rules "
        'in this project\'s .magi-code/settings.json ("allow always for this project"; '
        "honoured only in a trusted project), read and changed in that file; session "
        'grants ("allow for this session") are stored with the session, and listed and '
        "revoked through the running daemon, or in the session itself when none runs.",
    )
    grant_actions = grants.add_subparsers(dest="action", metavar="ACTION", required=True)
    grants_list = grant_actions.add_parser(
        "list", help="this project's grants, and a session's with --session"
    )
    grants_list.add_argument(
        "--session", dest="grant_session", metavar="ID", help="also this session's grants"
    )
    grants_list.add_argument("--json", action="store_true", help="print JSON")
    grants_revoke = grant_actions.add_parser(
        "revoke",
        help="remove one grant",
        description="Remove one grant: `--project commands git status` removes the "
        "project rule allowing `git status`; `--session ID paths docs/a.md` a session "
        "grant. Exits 1 when the grant is not there.",
    )
    where = grants_revoke.add_mutually_exclusive_group(required=True)
    where.add_argument("--project", action="store_true", help="a project grant")
    where.add_argument(
        "--session", dest="grant_session", metavar="ID", help="a grant of this session"
    )
    grants_revoke.add_argument(
        "kind", choices=("commands", "tools", "paths"), help="what the grant allows"
    )
    grants_revoke.add_argument(
        "words",
        metavar="VALUE",
        nargs="+",
        help="the command's argv words (after `--` if one starts with -), or the tool "
        "name or path pattern",
    )
    protocol = commands.add_parser("protocol", help="the v1 protocol's machine-readable schema")
    protocol_actions = protocol.add_subparsers(dest="action", metavar="ACTION", required=True)
    schema = protocol_actions.add_parser("schema", help="print or write the JSON Schemas")
    schema.add_argument(
        "--consumer",
        action="store_true",
        help="the schemas a client validates the service's output against",
    )
    schema.add_argument("--out", help="write one file per document into this directory")
    return parser


def _flag(name: str) -> str:
    return "--json" if name == "prompt_json" else f"--{name.replace('_', '-')}"


def _fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"magi-code: {message}\n")
    return code


def _configure_logging() -> None:
    import os

    from magi_code.logs import configure_stderr

    configure_stderr(os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv) == ["--app", "service"]:
        # What a frontend runs for every session, decided without argparse: building the
        # parser imports argparse, gettext/locale and shutil, a cost every shim start pays.
        return _run_service()
    if list(sys.argv[1:] if argv is None else argv) == ["--app", "acp"]:
        return _run_acp()
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging()
    if args.app is not None:
        used = [name for name in _EXCLUSIVE_WITH_APP if getattr(args, name)]
        if used or args.command or args.prompt_json:
            return _fail(f"--app {args.app} cannot be combined with other arguments or commands")
        return _run_service() if args.app == "service" else _run_acp()
    if args.command is not None:
        given = [_flag(name) for name in _EXCLUSIVE_WITH_APP if getattr(args, name)]
        if given or args.prompt_json:
            return _fail(f"{(given or ['--json'])[0]} goes with --prompt, not a command")
        try:
            return _run_command(args)
        except KeyboardInterrupt:
            from magi_code.daemonctl import EXIT_INTERRUPTED

            return _fail("interrupted", EXIT_INTERRUPTED)
    if args.prompt is not None:
        if not args.prompt.strip():
            return _fail("--prompt needs some text")
        return _run_prompt(args.prompt, args.session, args.provider, args.model, args.prompt_json)
    given = [_flag(name) for name in _PROMPT_ONLY if getattr(args, name)]
    if given:
        return _fail(f"{given[0]} goes with --prompt")
    parser.print_help(sys.stderr)
    return 2


def _run_command(args: argparse.Namespace) -> int:
    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext.from_process()
    if args.command == "daemon":
        from magi_code.daemonctl import commands

        if args.action == "run":
            return commands.run(ctx, on_demand=args.on_demand, ready_fd=args.ready_fd)
        return commands.main(
            ctx,
            args.action,
            json=getattr(args, "json", False),
            print_unit=getattr(args, "print_unit", False),
            force=getattr(args, "force", False),
        )
    if args.command in ("login", "logout", "auth"):
        from magi_code.daemonctl import login

        if args.command == "login":
            return login.login(ctx, args.login_provider, no_browser=args.no_browser)
        if args.command == "logout":
            return login.logout(ctx, args.login_provider)
        return login.status(ctx, as_json=args.json)
    if args.command == "doctor":
        from magi_code.daemonctl import doctor

        return doctor.main(ctx, as_json=args.json, network=args.network)
    if args.command == "sessions" and args.action in ("fork", "rewind"):
        from magi_code.daemonctl import rewind

        return rewind.main(
            ctx,
            args.action,
            args.session_ids[0],
            args.at,
            yes=getattr(args, "yes", False),
            files=not getattr(args, "no_files", False),
            force=getattr(args, "force", False),
        )
    if args.command == "sessions":
        from magi_code.daemonctl import sessions

        return sessions.main(
            ctx,
            args.action,
            getattr(args, "session_ids", []),
            as_json=getattr(args, "json", False),
            project=getattr(args, "project", None),
            title=getattr(args, "title", None),
            archived=getattr(args, "archived", False),
        )
    if args.command == "grants":
        from magi_code.daemonctl import grants

        return grants.main(
            ctx,
            args.action,
            session_id=args.grant_session,
            project=getattr(args, "project", False),
            kind=getattr(args, "kind", None),
            words=getattr(args, "words", ()),
            as_json=getattr(args, "json", False),
        )
    from magi_code.protocol import schema

    return schema.main(
        (["--consumer"] if args.consumer else []) + (["--out", args.out] if args.out else [])
    )


def _run_service() -> int:
    import os

    mode = os.environ.get(_MODE_ENV) or "auto"
    if mode == "embedded":
        return _run_in_process()
    if mode in ("auto", "daemon"):
        # No event loop, no logging set up and no LaunchContext (pathlib, dataclasses):
        # the shim with a warm daemon states its launch context as strings, imports no
        # asyncio (see shim.bridge) and writes its few diagnostics itself. ``auto`` (the
        # default) serves in this process when no daemon can be started or reached.
        from magi_code.shim.bridge import serve_shim

        return serve_shim(_run_in_process if mode == "auto" else None)
    return _fail(f"{_MODE_ENV} must be 'auto', 'daemon' or 'embedded'")


def _run_in_process() -> int:
    """The v1 service with the core in this process (embedded mode)."""
    import uvloop

    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext.from_process()
    _configure_logging()

    from magi_code.composition import build_coordinator
    from magi_code.stdio.adapter import serve_stdio

    return _finished(uvloop.run(serve_stdio(build_coordinator, ctx)))


def _run_acp() -> int:
    """ACP over stdio, through the daemon or in-process (``MC_SERVICE_MODE``)."""
    import uvloop

    from magi_code.storage.launch import LaunchContext

    _configure_logging()
    from magi_code.acp.agent import serve

    return _finished(uvloop.run(serve(LaunchContext.from_process())))


def _run_prompt(
    prompt: str, session: str | None, provider: str | None, model: str | None, as_json: bool
) -> int:
    import dataclasses

    import uvloop

    from magi_code.oneshot import run_prompt
    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext.from_process()
    overrides = {"MC_PROVIDER": provider, "MC_MODEL": model}
    env = {**ctx.env, **{k: v for k, v in overrides.items() if v}}
    ctx = dataclasses.replace(ctx, env=env)
    return _finished(uvloop.run(run_prompt(ctx, prompt, session, as_json=as_json)))


def _finished(code: int) -> int:
    """The service's work is written, drained and closed: leave every object alive now
    out of the interpreter's last garbage collection at exit, which would otherwise walk
    all loaded modules (~30 ms). Everything else about finalization (threads joined,
    ``atexit``, streams flushed) is unchanged."""
    import gc

    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(main())
