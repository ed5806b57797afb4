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

Keys, codes and tokens are never printed or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
import threading
import time
from typing import Any, Final

import orjson

from magi_code.auth import login as login_flow
from magi_code.auth.login import EXCHANGE_SUCCEEDED, CodexLogin
from magi_code.auth.operations import logout as remove_credentials
from magi_code.auth.readiness import provider_status
from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import ANTHROPIC_PROVIDER_ID, CODEX_PROVIDER_ID
from magi_code.config.settings import all_providers, load_settings
from magi_code.protocol.errors import ServiceError
from magi_code.storage.launch import LaunchContext

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


def _fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"magi-code: {message}\n")
    return code


def login(ctx: LaunchContext, provider: str, *, no_browser: bool) -> int:
    if provider == ANTHROPIC_PROVIDER_ID:
        return _store_anthropic_key(ctx)
    return asyncio.run(_codex_login(ctx, open_browser=not no_browser))


def _store_anthropic_key(ctx: LaunchContext) -> int:
    if sys.stdin.isatty():
        key = getpass.getpass("Anthropic API key (not echoed): ")
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key or len(key) > MAX_KEY_CHARS or any(ch.isspace() for ch in key):
        return _fail("no usable API key was given (one line, no spaces)", 2)
    try:
        AuthStore(ctx.auth_path).commit(
            ANTHROPIC_PROVIDER_ID, {"type": "api_key", "key": key}, None
        )
    except (ServiceError, OSError):
        return _fail("the credential store could not be written; check MC_HOME")
    sys.stdout.write("Stored the anthropic API key in the shared credential store.\n")
    if ctx.env.get("ANTHROPIC_API_KEY", "").strip():
        sys.stdout.write("Note: ANTHROPIC_API_KEY is set here and takes precedence over it.\n")
    return 0


async def _codex_login(ctx: LaunchContext, *, open_browser: bool) -> int:
    url_shown = asyncio.Event()

    def emit(state: str, extra: dict[str, Any]) -> None:
        if state == "authorization_url":
            sys.stdout.write(
                "Sign in to ChatGPT in your browser:\n"
                f"  {extra['url']}\n"
                "If the browser runs on another machine, paste the address it ends on here.\n"
            )
            sys.stdout.flush()
            if open_browser:
                _open_browser(str(extra["url"]))
            url_shown.set()

    flow = CodexLogin(ctx, AuthStore(ctx.auth_path), emit)
    run = asyncio.ensure_future(flow.run())
    paste = asyncio.ensure_future(_pasted_callback(flow, url_shown))
    try:
        outcome = await run
    except asyncio.CancelledError:
        flow.request_cancel()
        outcome = await run
    finally:
        paste.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await paste
    if outcome == EXCHANGE_SUCCEEDED:
        sys.stdout.write("Logged in to openai-codex; the credentials are in the shared store.\n")
        return 0
    return _fail(f"login failed: {CODEX_OUTCOMES.get(outcome, outcome)}")


async def _pasted_callback(flow: CodexLogin, url_shown: asyncio.Event) -> None:
    """The first non-empty stdin line after the URL is shown is the callback.

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
    if text and not flow.finished:
        with contextlib.suppress(ServiceError):
            flow.submit_callback(text)


def _set_once(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)


def _open_browser(url: str) -> None:
    import webbrowser

    with contextlib.suppress(Exception):
        webbrowser.open(url, new=1)


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
