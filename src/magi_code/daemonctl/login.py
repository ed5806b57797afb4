"""``magi-code login``, ``logout`` and ``auth status``: the shared credential store from a
terminal.

Both write ``$MC_HOME/auth.json`` exactly as the protocol's ``auth.*`` operations do (the
same store, lock and generations), so every frontend and the daemon see the result at
their next request.

- ``login --provider anthropic`` reads the API key from a no-echo prompt on a terminal,
  or the first line of stdin otherwise; never from the command line (argv is visible to
  every process of the machine).
- ``login --provider openai-codex`` runs the PKCE flow: it prints the authorization URL,
  opens a browser unless ``--no-browser``, and completes on the loopback callback or on
  a redirect URL pasted on stdin (for a browser on another machine).

Ctrl-C ends either with one line and exit status 130, and nothing stored: the key is
committed with SIGINT ignored (a commit under way finishes, and is then reported), and
the Codex flow is cancelled (an exchange it already completed still commits, as it
does for ``auth.login.cancel``). Standard input that ends is said as such: no key was
given; or, for Codex, nothing can be pasted, which ends the login at once when no
loopback listener could be opened either.

Keys, codes and tokens are never printed or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import signal
import sys
import threading
import time
from typing import Any, Final

import orjson

from magi_code.auth import login as login_flow
from magi_code.auth.browser import open_browser
from magi_code.auth.login import EXCHANGE_SUCCEEDED, CodexLogin
from magi_code.auth.operations import logout as remove_credentials
from magi_code.auth.readiness import provider_status
from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import ANTHROPIC_PROVIDER_ID, CODEX_PROVIDER_ID
from magi_code.config.settings import all_providers, load_settings
from magi_code.protocol.errors import ServiceError
from magi_code.storage.launch import LaunchContext

from . import EXIT_INTERRUPTED

MAX_KEY_CHARS: Final = 4096
LOGIN_PROVIDERS: Final = (CODEX_PROVIDER_ID, ANTHROPIC_PROVIDER_ID)
# What each Codex login terminal means for the person at the terminal.
CODEX_OUTCOMES: Final = {
    login_flow.CANCELLED: "the login was cancelled",
    login_flow.CALLBACK_TIMEOUT: "no callback arrived in time; run `magi-code login` again",
    login_flow.CALLBACK_FAILED: "the callback did not match this login (state or code); try again",
    login_flow.EXCHANGE_FAILED: "the issuer refused the code exchange; try again",
    login_flow.AUTH_CHANGED: "another process changed the stored login meanwhile; try again",
    login_flow.STORAGE_FAILED: "the credential store could not be written; check MC_HOME",
    login_flow.INTERNAL_ERROR: "an internal error; see `magi-code doctor`",
}
INTERRUPTED: Final = "login interrupted; nothing was stored"
NO_KEY_INPUT: Final = (
    "no API key was given: standard input ended before a line was read "
    "(pipe the key in, or run this in a terminal)"
)
# Codex, with standard input at its end: nothing can be pasted.
NOTHING_CAN_COMPLETE: Final = (
    "standard input is closed and the loopback callback port could not be opened, so "
    "nothing can complete this login; free the port, or run it where the address can be "
    "pasted"
)
NO_CALLBACK_NO_PASTE: Final = (
    "no browser callback arrived in time, and standard input is closed, so no address "
    "could be pasted; run `magi-code login` again"
)


def _fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"magi-code: {message}\n")
    return code


def login(ctx: LaunchContext, provider: str, *, no_browser: bool) -> int:
    if provider == ANTHROPIC_PROVIDER_ID:
        return _store_anthropic_key(ctx)
    return asyncio.run(_codex_login(ctx, browser=not no_browser))


def _store_anthropic_key(ctx: LaunchContext) -> int:
    try:
        key = _read_key()
        # Read: from here the commit runs to its end (it is one atomic replace).
        restore = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        if sys.stdin.isatty():
            sys.stderr.write("\n")  # the prompt's line was left open
        return _fail(INTERRUPTED, EXIT_INTERRUPTED)
    try:
        if key is None:
            return _fail(NO_KEY_INPUT, 2)
        key = key.strip()
        if not key or len(key) > MAX_KEY_CHARS or any(ch.isspace() for ch in key):
            return _fail("no usable API key was given (one line, no spaces)", 2)
        try:
            AuthStore(ctx.auth_path).commit(
                ANTHROPIC_PROVIDER_ID, {"type": "api_key", "key": key}, None
            )
        except (ServiceError, OSError):
            return _fail("the credential store could not be written; check MC_HOME")
    finally:
        signal.signal(signal.SIGINT, restore)
    sys.stdout.write("Stored the anthropic API key in the shared credential store.\n")
    if ctx.env.get("ANTHROPIC_API_KEY", "").strip():
        sys.stdout.write("Note: ANTHROPIC_API_KEY is set here and takes precedence over it.\n")
    return 0


def _read_key() -> str | None:
    """The key as typed (no echo) or its stdin line; ``None`` when input ended first."""
    try:
        if sys.stdin.isatty():
            return getpass.getpass("Anthropic API key (not echoed): ")
        line = sys.stdin.readline()
    except EOFError:  # Ctrl-D at the prompt
        return None
    return line or None


class _Terminal:
    """What happened at the terminal while the Codex flow ran."""

    def __init__(self) -> None:
        self.interrupted = False  # Ctrl-C
        self.input_closed = False  # standard input reached its end


async def _codex_login(ctx: LaunchContext, *, browser: bool) -> int:
    url_shown = asyncio.Event()
    terminal = _Terminal()

    def emit(state: str, extra: dict[str, Any]) -> None:
        if state == "authorization_url":
            sys.stdout.write(
                "Sign in to ChatGPT in your browser:\n"
                f"  {extra['url']}\n"
                "If the browser runs on another machine, paste the address it ends on here.\n"
            )
            sys.stdout.flush()
            if browser:
                open_browser(str(extra["url"]))
            url_shown.set()

    def interrupt() -> None:
        terminal.interrupted = True
        flow.request_cancel()

    flow = CodexLogin(ctx, AuthStore(ctx.auth_path), emit)
    loop = asyncio.get_running_loop()
    # Ctrl-C cancels the flow, which ends as any cancelled login does (listener closed,
    # nothing committed unless the exchange already completed).
    loop.add_signal_handler(signal.SIGINT, interrupt)
    paste = asyncio.ensure_future(_pasted_callback(flow, url_shown, terminal))
    try:
        outcome = await flow.run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        paste.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await paste
    if outcome == EXCHANGE_SUCCEEDED:
        sys.stdout.write("Logged in to openai-codex; the credentials are in the shared store.\n")
        return 0
    if outcome == login_flow.CANCELLED and terminal.interrupted:
        return _fail(INTERRUPTED, EXIT_INTERRUPTED)
    if terminal.input_closed and outcome in (login_flow.CANCELLED, login_flow.CALLBACK_TIMEOUT):
        message = NOTHING_CAN_COMPLETE if outcome == login_flow.CANCELLED else NO_CALLBACK_NO_PASTE
        return _fail(f"login failed: {message}")
    return _fail(f"login failed: {CODEX_OUTCOMES.get(outcome, outcome)}")


async def _pasted_callback(flow: CodexLogin, url_shown: asyncio.Event, terminal: _Terminal) -> None:
    """The first non-empty stdin line after the URL is shown is the callback.

    At the end of stdin nothing can be pasted: without a loopback listener either,
    nothing can complete the flow, so it is cancelled at once.

    Read in a daemon thread: a terminal's stdin stays open after a browser callback
    completed the login, and a pool thread blocked on it would hold the exit.
    """
    await url_shown.wait()
    loop = asyncio.get_running_loop()
    line: asyncio.Future[str] = loop.create_future()

    def read() -> None:
        while True:
            text = sys.stdin.readline()
            if not text or text.strip():
                with contextlib.suppress(RuntimeError):  # the loop already ended
                    loop.call_soon_threadsafe(_set_once, line, text.strip())
                return

    threading.Thread(target=read, name="magi-code-login-stdin", daemon=True).start()
    text = await line
    if flow.finished:
        return
    if not text:
        terminal.input_closed = True
        if flow.bound_port is None:
            flow.request_cancel()
        return
    with contextlib.suppress(ServiceError):
        flow.submit_callback(text)


def _set_once(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)


def logout(ctx: LaunchContext, provider: str) -> int:
    try:
        providers = all_providers(ctx, load_settings(ctx)).values()
        result = remove_credentials(AuthStore(ctx.auth_path), provider, True, providers)
    except ServiceError as exc:
        return _fail(f"logout failed: {exc.code.value}")
    what = "removed its stored credentials" if result["removed"] else "nothing was stored"
    sys.stdout.write(f"Logged out of {provider}: {what}; environment variables are unchanged.\n")
    return 0


def status(ctx: LaunchContext, *, as_json: bool) -> int:
    """``auth status``: the same entries as the protocol's ``auth.status``."""
    try:
        settings = load_settings(ctx)
        snapshot = AuthStore(ctx.auth_path).read()
    except ServiceError as exc:
        return _fail(f"cannot read the settings or the credential store ({exc.code.value})")
    entries = provider_status(ctx, all_providers(ctx, settings).values(), snapshot, time.time())
    if as_json:
        sys.stdout.write(orjson.dumps({"providers": entries}).decode() + "\n")
        return 0
    for entry in entries:
        sys.stdout.write(
            f"{entry['provider_id']:<16} {entry['readiness']:<12} "
            f"{entry['auth_method']} ({entry['source']})\n"
        )
    return 0
