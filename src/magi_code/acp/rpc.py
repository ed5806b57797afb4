"""JSON-RPC 2.0 over stdio, one message per line, for the ACP adapter.

Bounded: a line longer than :data:`MAX_LINE_BYTES` is discarded up to its newline and
answered with one ``invalid request`` error. Whatever a line holds, the peer answers it
(parse error, invalid request, method not found, invalid params) or ignores it (an
unknown notification, a response to nothing), and never stops for it. Requests run as
tasks, so a long ``session/prompt`` does not hold up ``session/cancel``; notifications
run in arrival order. The peer can also send requests to the editor (``fs/*``, and later
``session/request_permission``) and wait for their answers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson

from magi_code.stdio.adapter import ByteReader, ByteWriter, open_reader, open_writer

log = logging.getLogger(__name__)

# Embedded resources carry whole files; beyond this a message is refused, not buffered.
MAX_LINE_BYTES: Final = 8 * 1024 * 1024
READ_CHUNK: Final = 64 * 1024
MAX_ID_BYTES: Final = 256

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# ACP's own code: the agent needs the client to authenticate first.
AUTH_REQUIRED: Final = -32000


class RpcError(Exception):
    """An error answer: a JSON-RPC code, a fixed message, and optional data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_object(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_params(what: str) -> RpcError:
    return RpcError(INVALID_PARAMS, f"Invalid params: {what}")


Handler = Callable[[str, Any], Awaitable[Any]]


class Peer:
    """One JSON-RPC connection: ``requests`` and ``notifications`` map method names to
    handlers taking the params; a request handler returns the result or raises
    :class:`RpcError`."""

    def __init__(
        self,
        reader: ByteReader,
        writer: ByteWriter,
        requests: dict[str, Handler],
        notifications: dict[str, Handler],
    ) -> None:
        self._reader = reader
        self._writer = writer
        # Messages wait here for the one writer task, in the order they were sent.
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.output_failed = False
        self._requests = requests
        self._notifications = notifications
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- outgoing ------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        self._outbox.put_nowait(orjson.dumps(message) + b"\n")

    async def _write_out(self) -> None:
        while (data := await self._outbox.get()) is not None:
            if self.output_failed:
                continue
            try:
                await self._writer.write(data)
            except OSError:  # the editor went away: nothing more can reach it
                self.output_failed = True

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request to the editor; its result, or :class:`RpcError` with its error."""
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return await future
        finally:
            self._pending.pop(request_id, None)

    # -- incoming ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the editor closes stdin; then finish the running requests."""
        writer = asyncio.create_task(self._write_out())
        try:
            await self._read_in()
        finally:
            self._outbox.put_nowait(None)
            await writer

    async def _read_in(self) -> None:
        buffer = bytearray()
        discarding = False
        while True:
            chunk = await self._reader.read(READ_CHUNK)
            if not chunk:
                break
            buffer += chunk
            while True:
                end = buffer.find(b"\n")
                if end < 0:
                    if len(buffer) > MAX_LINE_BYTES:
                        if not discarding:
                            self._too_large()
                        discarding = True
                        buffer.clear()
                    break
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if discarding:
                    discarding = False
                elif len(line) > MAX_LINE_BYTES:
                    self._too_large()
                elif line.strip():
                    await self._line(line)
        # End of input ends the conversation: the editor hears nothing more.
        for future in self._pending.values():
            future.cancel()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _too_large(self) -> None:
        self._error(
            None, RpcError(INVALID_REQUEST, "Message too large", {"max_bytes": MAX_LINE_BYTES})
        )

    def _error(self, request_id: Any, error: RpcError) -> None:
        self._send({"jsonrpc": "2.0", "id": request_id, "error": error.to_object()})

    async def _line(self, line: bytes) -> None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._error(None, RpcError(PARSE_ERROR, "Parse error"))
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._error(None, RpcError(INVALID_REQUEST, "Invalid Request"))
            return
        request_id = message.get("id")
        has_id = "id" in message
        if has_id and not _valid_id(request_id):
            self._error(None, RpcError(INVALID_REQUEST, "Invalid Request"))
            return
        method = message.get("method")
        if method is None and has_id:
            self._response(request_id, message)
            return
        if not isinstance(method, str):
            self._error(
                request_id if has_id else None, RpcError(INVALID_REQUEST, "Invalid Request")
            )
            return
        params = message.get("params")
        if not has_id:
            handler = self._notifications.get(method)
            if handler is not None:  # an unknown notification is ignored (JSON-RPC 2.0)
                await self._run(handler, method, params, None, notification=True)
            return
        request_handler = self._requests.get(method)
        if request_handler is None:
            self._error(
                request_id, RpcError(METHOD_NOT_FOUND, "Method not found", {"method": method[:128]})
            )
            return
        task = asyncio.create_task(self._run(request_handler, method, params, request_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        handler: Handler,
        method: str,
        params: Any,
        request_id: Any,
        *,
        notification: bool = False,
    ) -> None:
        try:
            result = await handler(method, params)
        except RpcError as error:
            if not notification:
                self._error(request_id, error)
            return
        except Exception:  # a bug must not end the adapter: answer it and log it
            log.exception("ACP %s failed", method)
            if not notification:
                self._error(request_id, RpcError(INTERNAL_ERROR, "Internal error"))
            return
        if not notification:
            self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _response(self, request_id: Any, message: dict[str, Any]) -> None:
        future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is None or future.done():
            return
        error = message.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            text = error.get("message")
            future.set_exception(
                RpcError(
                    code if isinstance(code, int) else INTERNAL_ERROR,
                    text if isinstance(text, str) else "Error",
                    error.get("data"),
                )
            )
        else:
            future.set_result(message.get("result"))


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) <= MAX_ID_BYTES


async def stdio() -> tuple[ByteReader, ByteWriter]:
    """stdin, and a private duplicate of stdout; fd 1 then points at stderr, so nothing
    else in the process (or a child that inherits it) can corrupt the stream."""
    reader = await open_reader(0)
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return reader, await open_writer(proto_fd)
