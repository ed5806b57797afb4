"""Command line entry point: ``magi-code --app service``, ``--prompt`` and ``daemon``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

# Options that select a provider, model, credential, theme or session: the v1 contract
# forbids combining any of them (or a subcommand) with ``--app service``.
_EXCLUSIVE_WITH_APP = (
    "prompt",
    "provider",
    "model",
    "api_key",
    "theme",
    "session",
    "resume",
    "json",
    "print_unit",
    "force",
    "on_demand",
    "ready_fd",
)
_MODE_ENV = "MC_SERVICE_MODE"


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog="magi-code", description="magi-code coding agent")
    parser.add_argument("--app", choices=["service"], help="run the application service on stdio")
    parser.add_argument("--prompt", help="run one turn with this prompt and print the answer")
    parser.add_argument("--provider", help="provider id for --prompt")
    parser.add_argument("--model", help="model id for --prompt")
    parser.add_argument("--api-key", dest="api_key", help=argparse.SUPPRESS)
    parser.add_argument("--theme", help=argparse.SUPPRESS)
    parser.add_argument("--session", help="continue this session (with --prompt)")
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="daemon status: print JSON")
    parser.add_argument(
        "--print", dest="print_unit", action="store_true", help="daemon install: print only"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="daemon install: replace a different unit file; uninstall: remove it anyway",
    )
    parser.add_argument(
        "--on-demand", dest="on_demand", action="store_true", help=argparse.SUPPRESS
    )
    parser.add_argument("--ready-fd", dest="ready_fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "command",
        nargs="*",
        help="subcommand: daemon start|stop|restart|status|run|install|uninstall",
    )
    return parser


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
    args = _parser().parse_args(argv)
    _configure_logging()
    if args.app == "service":
        used = [name for name in _EXCLUSIVE_WITH_APP if getattr(args, name)]
        if used or args.command:
            return _fail("--app service cannot be combined with other arguments or subcommands")
        return _run_service()
    if args.command[:1] == ["daemon"] and len(args.command) == 2:
        return _run_daemon_command(args)
    if args.prompt is not None:
        if args.command:
            return _fail("--prompt cannot be combined with a subcommand")
        if not args.prompt.strip():
            return _fail("--prompt needs some text")
        return _run_prompt(args.prompt, args.session, args.provider, args.model)
    if args.session or args.provider or args.model:
        return _fail("--session, --provider and --model go with --prompt")
    return _fail("nothing to do; try 'magi-code --app service' or 'magi-code --help'")


def _run_service() -> int:
    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext.from_process()
    mode = ctx.env.get(_MODE_ENV) or "daemon"
    if mode == "embedded":
        import uvloop

        _configure_logging()

        # ``initialize`` is answered before the domain services are loaded (composition).
        from magi_code.composition import build_embedded_coordinator
        from magi_code.stdio.adapter import serve_stdio

        return _finished(uvloop.run(serve_stdio(build_embedded_coordinator, ctx)))
    if mode == "daemon":
        # No event loop, and no logging set up: the shim with a warm daemon imports no
        # asyncio (see shim.bridge) and writes its few diagnostics itself.
        from magi_code.shim.bridge import serve_shim

        return serve_shim(ctx)
    return _fail(f"{_MODE_ENV} must be 'daemon' or 'embedded'")


def _run_daemon_command(args: argparse.Namespace) -> int:
    from magi_code.daemonctl import commands
    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext.from_process()
    action = args.command[1]
    if action == "run":
        return commands.run(ctx, on_demand=args.on_demand, ready_fd=args.ready_fd)
    return commands.main(ctx, action, json=args.json, print_unit=args.print_unit, force=args.force)


def _run_prompt(prompt: str, session: str | None, provider: str | None, model: str | None) -> int:
    import dataclasses

    import uvloop

    from magi_code.oneshot import run_prompt
    from magi_code.storage.launch import LaunchContext

    ctx = LaunchContext.from_process()
    overrides = {"MC_PROVIDER": provider, "MC_MODEL": model}
    env = {**ctx.env, **{k: v for k, v in overrides.items() if v}}
    ctx = dataclasses.replace(ctx, env=env)
    return _finished(uvloop.run(run_prompt(ctx, prompt, session)))


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
