"""One Codex (ChatGPT OAuth) login attempt: PKCE, loopback or manual callback, exchange.

``run()`` emits the progress states in order (``authorization_url`` → ``waiting`` →
``callback_received`` → ``callback_accepted``) through ``emit`` and returns exactly one
terminal label after cleaning up its listener; the coordinator turns both into
``auth.login.progress`` / ``auth.login.terminal`` events. Callback input, codes and
tokens are never emitted, logged or put into exceptions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from magi_code.auth import oauth
from magi_code.auth.loopback import CallbackListener, callback_code, state_matches
from magi_code.auth.store import AuthChanged, AuthStore
from magi_code.auth.tokens import CODEX_PROVIDER_ID, codex_record
from magi_code.config.settings import load_settings
from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.providers.errors import ProviderFailure
from magi_code.providers.http import build_client, transport_options
from magi_code.storage.launch import LaunchContext

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

EXCHANGE_SUCCEEDED: Final = "exchange_succeeded"
CANCELLED: Final = "cancelled"
CALLBACK_TIMEOUT: Final = "callback_timeout"
CALLBACK_FAILED: Final = "callback_failed"
EXCHANGE_FAILED: Final = "exchange_failed"
AUTH_CHANGED: Final = "auth_changed"
STORAGE_FAILED: Final = "storage_failed"
INTERNAL_ERROR: Final = "internal_error"
TERMINAL_STATES: Final = frozenset(
    {
        EXCHANGE_SUCCEEDED,
        CANCELLED,
        CALLBACK_TIMEOUT,
        CALLBACK_FAILED,
        EXCHANGE_FAILED,
        AUTH_CHANGED,
        STORAGE_FAILED,
        INTERNAL_ERROR,
    }
)

MAX_CALLBACK_INPUT_BYTES: Final = 4096
CALLBACK_WAIT_S: Final = 300.0

Emit = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class _Callback:
    # Loopback callbacks arrive already validated (``code`` or None for rejected);
    # manual input is parsed by the flow after ``callback_received``.
    code: str | None = None
    manual_text: str | None = None


def manual_code(text: str, expected_state: str) -> str | None:
    """The code in manual input: a redirect URL or query (state must match), ``code#state``
    or a bare code; ``None`` when the input is not acceptable for this attempt."""
    text = text.strip()
    if "://" in text:
        return callback_code(urlsplit(text).query, expected_state)
    if "code=" in text:
        return callback_code(text.lstrip("?"), expected_state)
    if "#" in text:
        code, state = text.split("#", 1)
        return code if state_matches(state, expected_state) and oauth.valid_code(code) else None
    return text if oauth.valid_code(text) else None


class CodexLogin:
    """A single login attempt; create a new one to retry."""

    def __init__(
        self,
        ctx: LaunchContext,
        store: AuthStore,
        emit: Emit,
        client: httpx.AsyncClient | None = None,
        *,
        callback_timeout: float = CALLBACK_WAIT_S,
        exchange_timeout: float = oauth.TOKEN_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ctx = ctx
        self._store = store
        self._emit = emit
        self._client = client
        self._callback_timeout = callback_timeout
        self._exchange_timeout = exchange_timeout
        self._clock = clock
        self._input: _Callback | None = None
        self._input_ready = asyncio.Event()
        self._cancel = asyncio.Event()
        self._listener: CallbackListener | None = None
        self._bound_port: int | None = None
        self._finished = False

    @property
    def bound_port(self) -> int | None:
        """The loopback port actually bound (``None`` before binding or when unavailable)."""
        return self._bound_port

    @property
    def finished(self) -> bool:
        return self._finished

    def submit_callback(self, text: str) -> None:
        """Manual callback: a final redirect URL or a code, accepted once, never echoed.

        Raises ``ServiceError``: ``unknown_login`` after the terminal, ``invalid_payload``
        for empty or over-4096-byte input, ``auth_busy`` once a callback was received.
        """
        if self._finished:
            raise ServiceError(ErrorCode.UNKNOWN_LOGIN)
        if not text or len(text.encode("utf-8", "surrogatepass")) > MAX_CALLBACK_INPUT_BYTES:
            raise ServiceError(ErrorCode.INVALID_PAYLOAD)
        if not self._accept(_Callback(manual_text=text)):
            raise ServiceError(ErrorCode.AUTH_BUSY)

    def request_cancel(self) -> None:
        """Ask the flow to end as ``cancelled`` (a commit that already started still wins)."""
        self._cancel.set()

    def _accept(self, callback: _Callback) -> bool:
        if self._input is not None or self._finished:
            return False
        self._input = callback
        self._input_ready.set()
        return True

    def _on_loopback(self, code: str | None) -> bool:
        return self._accept(_Callback(code=code))

    async def run(self) -> str:
        """Drive the flow to its terminal label; the listener is closed before returning."""
        try:
            state = await self._run()
        except Exception as exc:  # noqa: BLE001 - a login worker must always end in one terminal
            log.error("codex login failed unexpectedly (%s)", type(exc).__name__)
            state = INTERNAL_ERROR
        finally:
            self._finished = True
            await self._close_listener()
        log.info("codex login finished: %s", state)
        return state

    async def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()

    async def _run(self) -> str:
        try:
            issuer = oauth.issuer_url(self._ctx.env)
            port = oauth.callback_port(self._ctx.env)
            observed = (await asyncio.to_thread(self._store.read)).generation(CODEX_PROVIDER_ID)
        except ServiceError:
            return INTERNAL_ERROR
        if self._cancel.is_set():
            return CANCELLED
        verifier, challenge = oauth.new_pkce()
        state = oauth.new_state()
        await self._bind(state, port)
        redirect = oauth.redirect_uri(self._bound_port or port or oauth.DEFAULT_CALLBACK_PORT)
        try:
            url = oauth.authorize_url(issuer, redirect, challenge, state)
        except ServiceError:
            return INTERNAL_ERROR
        self._emit("authorization_url", {"url": url, "open_browser": True})
        self._emit("waiting", {})
        callback = await self._wait_for_callback()
        await self._close_listener()
        if callback is None:
            return CANCELLED if self._cancel.is_set() else CALLBACK_TIMEOUT
        self._emit("callback_received", {})
        code = callback.code
        if callback.manual_text is not None:
            code = manual_code(callback.manual_text, state)
        if code is None:
            return CALLBACK_FAILED
        self._emit("callback_accepted", {})
        if self._cancel.is_set():
            return CANCELLED
        return await self._exchange_and_commit(issuer, code, redirect, verifier, observed)

    async def _bind(self, state: str, port: int) -> None:
        listener = CallbackListener(state, self._on_loopback)
        try:
            self._bound_port = await listener.start(port)
        except OSError:
            # Busy port or no loopback: manual submission still completes the flow.
            log.warning("login callback listener unavailable; manual callback only")
            return
        self._listener = listener

    async def _wait_for_callback(self) -> _Callback | None:
        waits = {
            asyncio.ensure_future(self._input_ready.wait()),
            asyncio.ensure_future(self._cancel.wait()),
        }
        try:
            await asyncio.wait(
                waits, timeout=self._callback_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if self._cancel.is_set():
            return None
        return self._input

    async def _exchange_and_commit(
        self, issuer: str, code: str, redirect: str, verifier: str, observed: int
    ) -> str:
        try:
            if self._client is not None:
                tokens = await self._exchange(self._client, issuer, code, redirect, verifier)
            else:
                async with await self._issuer_client() as client:
                    tokens = await self._exchange(client, issuer, code, redirect, verifier)
        except (oauth.TokenRequestError, ServiceError, ProviderFailure):
            return EXCHANGE_FAILED
        record = codex_record(tokens, self._clock())
        if record is None:
            return EXCHANGE_FAILED
        # The exchange ran to completion (bounded); a cancel that arrived meanwhile still
        # wins over storing the credential.
        if self._cancel.is_set():
            return CANCELLED
        try:
            await asyncio.to_thread(self._store.commit, CODEX_PROVIDER_ID, record, observed)
        except AuthChanged:
            return AUTH_CHANGED
        except ServiceError:
            return STORAGE_FAILED
        return EXCHANGE_SUCCEEDED

    async def _issuer_client(self) -> httpx.AsyncClient:
        """A client of this attempt's own, with the frontend's proxy and CAs (its launch
        environment and the settings' ``network`` entry, never this process's).

        Raises:
            ServiceError: the settings cannot be read; ProviderFailure: no usable client.
        """
        settings = await asyncio.to_thread(load_settings, self._ctx)
        options = transport_options(self._ctx.env, settings.network)
        return await asyncio.to_thread(build_client, options)

    async def _exchange(
        self, client: httpx.AsyncClient, issuer: str, code: str, redirect: str, verifier: str
    ) -> dict[str, Any]:
        return await oauth.exchange_code(
            client,
            issuer,
            code=code,
            redirect=redirect,
            verifier=verifier,
            timeout=self._exchange_timeout,
        )
