"""The OAuth redirect listener: a tiny HTTP/1.1 responder on 127.0.0.1.

It answers exactly one thing: ``GET /auth/callback?code=…&state=…``. Other paths get 404
and the flow keeps waiting; a callback with the wrong state, an ``error`` or no code is
reported as a rejected callback. The browser always gets a small fixed page: nothing
from the request is reflected back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Callable
from typing import Final
from urllib.parse import parse_qs, urlsplit

from magi_code.auth.oauth import CALLBACK_PATH, valid_code

MAX_REQUEST_HEAD_BYTES: Final = 8192
REQUEST_READ_TIMEOUT_S: Final = 10.0

_PAGES: Final = {
    200: ("OK", "Sign-in received. You can close this window and return to the application."),
    400: ("Bad Request", "Sign-in failed. Start a new login from the application."),
    404: ("Not Found", "Not found."),
    405: ("Method Not Allowed", "Method not allowed."),
    409: ("Conflict", "This sign-in was already handled."),
}

# Receives the validated code, or None for a rejected callback; returns False when the
# login already has its one callback (the request is then answered 409).
CallbackSink = Callable[[str | None], bool]


def single(params: dict[str, list[str]], key: str) -> str | None:
    values = params.get(key)
    return values[0] if values is not None and len(values) == 1 else None


def state_matches(candidate: str | None, expected: str) -> bool:
    if candidate is None:
        return False
    return hmac.compare_digest(candidate.encode(), expected.encode())


def callback_code(query: str, expected_state: str) -> str | None:
    """The code from a redirect query if it is a valid success redirect for this attempt."""
    params = parse_qs(query, keep_blank_values=True)
    code = single(params, "code")
    if "error" in params or not state_matches(single(params, "state"), expected_state):
        return None
    return code if valid_code(code) else None


def _response(status: int) -> bytes:
    reason, text = _PAGES[status]
    body = (
        "<!doctype html><html><head><meta charset=utf-8><title>magi-code</title></head>"
        f"<body><p>{text}</p></body></html>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


class CallbackListener:
    def __init__(self, state: str, sink: CallbackSink) -> None:
        self._state = state
        self._sink = sink
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, port: int) -> int:
        """Bind ``127.0.0.1:port`` (0 = any free port) and return the bound port."""
        self._server = await asyncio.start_server(
            self._on_connection, host="127.0.0.1", port=port, limit=MAX_REQUEST_HEAD_BYTES
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        """Stop listening and drop in-flight connections; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            async with asyncio.timeout(REQUEST_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(_response(self._route(head)))
                await writer.drain()
        except (
            TimeoutError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass  # a broken or slow client only loses its own connection
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _route(self, head: bytes) -> int:
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3:
            return 400
        method, target, _ = parts
        if method != "GET":
            return 405
        url = urlsplit(target)
        if url.path != CALLBACK_PATH:
            return 404
        code = callback_code(url.query, self._state)
        if not self._sink(code):
            return 409
        return 200 if code is not None else 400
