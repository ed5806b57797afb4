"""Loopback fake model provider speaking the real wire formats (tests only).

One HTTP/1.1 server answers all three streaming APIs, chosen by request path:

- ``POST …/chat/completions`` → OpenAI chat-completions chunks ending ``data: [DONE]``
- ``POST …/messages``         → Anthropic ``message_start`` … ``message_stop``
- ``POST …/responses``        → Responses ``response.*`` events ending ``response.completed``
- ``GET …/models``            → Anthropic listing (``anthropic-version`` header; paged),
  Codex listing (``client_version`` query) or OpenAI ``{"data":[…]}`` listing.

Each POST takes the next scripted reply from a FIFO queue (or the default reply; with
neither it answers 400). Replies: ``Reply`` (text chunks, tool calls, reasoning summary,
usage, and an ``ending``: complete / eof / disconnect / stall / error_event /
malformed), ``HttpError`` (status, JSON body, retry-after), ``Fast`` (N deltas as fast
as possible) and ``RawSSE`` (frames verbatim). ``route(marker, *replies, default=...)``
answers the requests whose body contains ``marker`` from their own queue first, then
with its default if given (concurrent subagents, summary requests);
``Reply.measure_input`` reports the request body's size / 4 as its input tokens. Every
request except the control routes is recorded (method, path, query, lower-cased headers,
body, parsed JSON).
Streams use chunked encoding with one chunk per SSE frame, drained as written, on
sockets with TCP_NODELAY; a ``disconnect`` aborts the socket mid-body.

In-process use (pytest)::

    with FakeProviderServer() as fake:
        fake.enqueue(Reply(text=["Hel", "lo"]))
        ... point a client at fake.base_url ...
        assert fake.requests[0].json["stream"] is True

Separate process (process-level tests)::

    python -m tests.support.fake_providers --port 0 --script replies.json

prints one JSON line ``{"port": N, "base_url": "http://127.0.0.1:N"}`` and serves until
SIGTERM/SIGINT. The script file is a JSON list of replies, or an object with
``replies``, ``default`` and ``models``. Control routes, usable in both modes:
``POST /__fake__/enqueue`` (JSON list of replies), ``POST /__fake__/route`` (``{"marker",
"replies", "default"}``, as ``route``), ``GET /__fake__/requests`` and
``GET /__fake__/state`` (``{"pending", "disconnects", "connections"}``). Reply JSON uses
the dataclass field names plus ``"kind"``: ``reply`` (default), ``http_error``, ``fast`` or ``raw``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import orjson
import uvloop

SECRET_PROVIDER_TEXT = "fake-provider-text-must-not-leak"

Ending = Literal["complete", "eof", "disconnect", "stall", "error_event", "malformed"]


@dataclass(frozen=True)
class FakeToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class FakeUsage:
    input_tokens: int = 12
    output_tokens: int = 7
    cache_read_tokens: int = 4
    reasoning_tokens: int = 3
    # Anthropic only (``cache_creation_input_tokens``); part of ``input_tokens`` as well.
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class Reply:
    """A 200 event stream in the requesting API's format.

    ``after_chunks`` (default: all) is how many text chunks go out before a non-complete
    ``ending``: ``eof`` ends the body cleanly without the API's terminal event,
    ``disconnect`` aborts the socket, ``stall`` hangs until the client disconnects,
    ``error_event`` sends the API's in-stream error, ``malformed`` sends a non-JSON frame.
    ``hold`` (an event of the test's): after its text chunks the stream waits, open, until
    the event is set, then ends (a turn that runs exactly as long as the test needs).
    """

    text: Sequence[str] = ("Hello", " world")
    chunk_delay: float = 0.0
    tool_calls: Sequence[FakeToolCall] = ()
    reasoning_summary: str | None = None
    usage: FakeUsage | None = field(default_factory=FakeUsage)
    stop: Literal["auto", "end_turn", "max_tokens"] = "auto"
    ending: Ending = "complete"
    after_chunks: int | None = None
    error_code: str = "server_error"
    headers: Mapping[str, str] = field(default_factory=dict)
    # ``usage.input_tokens`` becomes the request body's size / 4 (a prompt that grows
    # reports growing usage, as a real provider's would).
    measure_input: bool = False
    hold: threading.Event | None = None


@dataclass(frozen=True)
class HttpError:
    """A plain response (any status): ``body`` is JSON, raw ``bytes``, or None for a
    generic error object."""

    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    retry_after: str | None = None


@dataclass(frozen=True)
class Fast:
    """``count`` text deltas of ``text`` written back to back (benchmarks)."""

    count: int
    text: str = "x"


@dataclass(frozen=True)
class RawSSE:
    """Frames written verbatim as a 200 ``text/event-stream`` body."""

    frames: Sequence[bytes]
    status: int = 200


ScriptedReply = Reply | HttpError | Fast | RawSSE


@dataclass(frozen=True)
class FakeModel:
    model_id: str
    display_name: str | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    reasoning_levels: Sequence[str] | None = None  # Codex efforts, e.g. "low", "xhigh"
    visibility: str = "list"


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    json: Any


def reply_from_json(spec: Mapping[str, Any]) -> ScriptedReply:
    """Build a scripted reply from its JSON form (see module docstring)."""
    data = dict(spec)
    kind = data.pop("kind", "reply")
    if kind == "http_error":
        return HttpError(**data)
    if kind == "fast":
        return Fast(**data)
    if kind == "raw":
        return RawSSE([f.encode() for f in data.pop("frames")], **data)
    if "tool_calls" in data:
        data["tool_calls"] = [FakeToolCall(**c) for c in data["tool_calls"]]
    if data.get("usage") is not None:
        data["usage"] = FakeUsage(**data["usage"])
    return Reply(**data)


# -- SSE rendering ------------------------------------------------------------------------


def _frame(data: Any, event: str | None = None) -> bytes:
    # orjson: a stand-in for a remote server should cost the machine little.
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    head = f"event: {event}\n".encode() if event else b""
    return b"%sdata: %s\n\n" % (head, payload)


@dataclass
class _Plan:
    prelude: list[bytes]
    text: list[bytes]
    postlude: list[bytes]
    terminal: list[bytes]
    error: bytes


def _stop(reply: Reply) -> str:
    if reply.stop != "auto":
        return reply.stop
    return "tool_use" if reply.tool_calls else "end_turn"


def _split(arguments: str) -> list[str]:
    half = len(arguments) // 2
    return [arguments[:half], arguments[half:]]


def _anthropic_plan(reply: Reply) -> _Plan:
    def ev(data: dict[str, Any]) -> bytes:
        return _frame(data, data["type"])

    usage = reply.usage
    uncached = (
        usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens if usage else 0
    )
    start_usage = {
        "input_tokens": uncached,
        "cache_creation_input_tokens": usage.cache_write_tokens if usage else 0,
        "cache_read_input_tokens": usage.cache_read_tokens if usage else 0,
        "output_tokens": 1,
    }
    message: dict[str, Any] = {"id": "msg_fake", "type": "message", "role": "assistant"}
    message.update({"content": []})
    message.update({"model": "fake", "stop_reason": None, "usage": start_usage})
    prelude = [ev({"type": "message_start", "message": message})]
    index = 0
    if reply.reasoning_summary is not None:
        block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        prelude += [
            ev({"type": "content_block_start", "index": 0, "content_block": block}),
            ev(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": reply.reasoning_summary},
                }
            ),
            ev(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "signature_delta", "signature": "sig-fake"},
                }
            ),
            ev({"type": "content_block_stop", "index": 0}),
        ]
        index = 1
    text_block = {"type": "text", "text": ""}
    prelude.append(ev({"type": "content_block_start", "index": index, "content_block": text_block}))
    prelude.append(ev({"type": "ping"}))
    text = [
        ev(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": chunk},
            }
        )
        for chunk in reply.text
    ]
    postlude = [ev({"type": "content_block_stop", "index": index})]
    for call in reply.tool_calls:
        index += 1
        block = {"type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}
        postlude.append(ev({"type": "content_block_start", "index": index, "content_block": block}))
        for part in ["", *_split(call.arguments)]:
            delta = {"type": "input_json_delta", "partial_json": part}
            postlude.append(ev({"type": "content_block_delta", "index": index, "delta": delta}))
        postlude.append(ev({"type": "content_block_stop", "index": index}))
    delta_usage = {"output_tokens": usage.output_tokens} if usage else {}
    postlude.append(
        ev(
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop(reply), "stop_sequence": None},
                "usage": delta_usage,
            }
        )
    )
    error = {"type": "error", "error": {"type": reply.error_code, "message": SECRET_PROVIDER_TEXT}}
    return _Plan(prelude, text, postlude, [ev({"type": "message_stop"})], ev(error))


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
    chunk.update({"model": "fake", "choices": [choice]})
    return _frame(chunk)


def _chat_plan(reply: Reply) -> _Plan:
    prelude = [_chat_chunk({"role": "assistant", "content": ""})]
    if reply.reasoning_summary is not None:
        prelude.append(_chat_chunk({"reasoning_content": reply.reasoning_summary}))
    text = [_chat_chunk({"content": chunk}) for chunk in reply.text]
    postlude = []
    for i, call in enumerate(reply.tool_calls):
        function = {"name": call.name, "arguments": ""}
        first = {"index": i, "id": call.call_id, "type": "function", "function": function}
        postlude.append(_chat_chunk({"tool_calls": [first]}))
        for part in _split(call.arguments):
            postlude.append(
                _chat_chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
            )
    finish = {"tool_use": "tool_calls", "max_tokens": "length"}.get(_stop(reply), "stop")
    postlude.append(_chat_chunk({}, finish))
    if reply.usage is not None:
        u = reply.usage
        usage = {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        }
        postlude.append(_frame({"id": "chatcmpl-fake", "choices": [], "usage": usage}))
    error = {"error": {"message": SECRET_PROVIDER_TEXT, "type": reply.error_code}}
    return _Plan(prelude, text, postlude, [_frame("[DONE]")], _frame(error))


def _responses_plan(reply: Reply) -> _Plan:
    def ev(data: dict[str, Any]) -> bytes:
        return _frame(data, data["type"])

    response = {"id": "resp_fake", "object": "response", "status": "in_progress", "output": []}
    prelude = [
        ev({"type": "response.created", "response": response}),
        ev({"type": "response.in_progress", "response": response}),
    ]
    index = 0
    if reply.reasoning_summary is not None:
        summary = reply.reasoning_summary
        item: dict[str, Any] = {"type": "reasoning", "id": "rs_fake", "summary": []}
        part = {"type": "summary_text", "text": summary}
        done_item = {**item, "summary": [part], "encrypted_content": "enc-fake"}
        ids = {"item_id": "rs_fake", "output_index": 0, "summary_index": 0}
        prelude += [
            ev({"type": "response.output_item.added", "output_index": 0, "item": item}),
            ev({"type": "response.reasoning_summary_part.added", **ids, "part": part}),
            ev({"type": "response.reasoning_summary_text.delta", **ids, "delta": summary}),
            ev({"type": "response.reasoning_summary_text.done", **ids, "text": summary}),
            ev({"type": "response.reasoning_summary_part.done", **ids, "part": part}),
            ev({"type": "response.output_item.done", "output_index": 0, "item": done_item}),
        ]
        index = 1
    message = {"type": "message", "id": "msg_fake", "role": "assistant", "content": []}
    prelude.append(
        ev({"type": "response.output_item.added", "output_index": index, "item": message})
    )
    ids = {"item_id": "msg_fake", "output_index": index, "content_index": 0}
    text = [ev({"type": "response.output_text.delta", **ids, "delta": c}) for c in reply.text]
    full = "".join(reply.text)
    done_message = {**message, "content": [{"type": "output_text", "text": full}]}
    postlude = [
        ev({"type": "response.output_text.done", **ids, "text": full}),
        ev({"type": "response.output_item.done", "output_index": index, "item": done_message}),
    ]
    for call in reply.tool_calls:
        index += 1
        item = {"type": "function_call", "id": f"fc_{index}"}
        item.update({"call_id": call.call_id, "name": call.name, "arguments": ""})
        postlude.append(
            ev({"type": "response.output_item.added", "output_index": index, "item": item})
        )
        for piece in _split(call.arguments):
            delta: dict[str, Any] = {"item_id": item["id"], "output_index": index, "delta": piece}
            postlude.append(ev({"type": "response.function_call_arguments.delta", **delta}))
        done = {**item, "arguments": call.arguments}
        postlude.append(
            ev({"type": "response.output_item.done", "output_index": index, "item": done})
        )
    final: dict[str, Any] = {**response, "status": "completed"}
    if reply.usage is not None:
        u = reply.usage
        final["usage"] = {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.input_tokens + u.output_tokens,
        }
    if reply.stop == "max_tokens":
        final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        terminal = [ev({"type": "response.incomplete", "response": final})]
    else:
        terminal = [ev({"type": "response.completed", "response": final})]
    failed: dict[str, Any] = {**response, "status": "failed"}
    failed["error"] = {"code": reply.error_code, "message": SECRET_PROVIDER_TEXT}
    return _Plan(
        prelude, text, postlude, terminal, ev({"type": "response.failed", "response": failed})
    )


_PLANS = {"anthropic": _anthropic_plan, "chat": _chat_plan, "responses": _responses_plan}


def _fast_frames(api: str, fast: Fast) -> tuple[list[bytes], bytes, list[bytes]]:
    plan = _PLANS[api](Reply(text=[fast.text]))
    return plan.prelude, plan.text[0], plan.postlude + plan.terminal


def _api_for(path: str) -> str | None:
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    return None


# -- HTTP server --------------------------------------------------------------------------


class _ClientGone(Exception):
    pass


class FakeProviderServer:
    """The fake server; ``start()`` runs it on its own event loop in a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, record: bool = True) -> None:
        self.host = host
        self.port = port
        # Without ``record`` no request is parsed or kept: a benchmark's long tool loop
        # sends tens of MiB of bodies a turn, which would grow this process and its CPU.
        self.record = record
        self.models: list[FakeModel] = [
            FakeModel("fake-model", "Fake Model", 200_000, 8192, ("low", "medium", "high"))
        ]
        self.models_page_size = 1000
        self.listing_reply: HttpError | None = None  # answer GET …/models with this instead
        self.listing_delay = 0.0  # seconds before answering GET …/models (slow discovery)
        # When set: GET …/models is answered only once this event is set (held discovery).
        self.listing_gate: threading.Event | None = None
        self.stall_timeout = 30.0
        self._lock = threading.Condition()
        self._queue: deque[ScriptedReply] = deque()
        self._default: ScriptedReply | None = None
        # (marker, replies, default): a request whose body contains a marker takes its
        # replies first, then the route's default if it has one (``route``).
        self._routes: list[tuple[bytes, deque[ScriptedReply], ScriptedReply | None]] = []
        self._requests: list[RecordedRequest] = []
        self._disconnects = 0
        self._connections = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- scripting and inspection (thread-safe) --

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def enqueue(self, *replies: ScriptedReply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def route(
        self, marker: str, *replies: ScriptedReply, default: ScriptedReply | None = None
    ) -> None:
        """Answer requests whose body contains ``marker`` with ``replies`` (in order)
        before the common queue; once they are used up, with ``default`` when given (every
        such request), else from the common queue."""
        with self._lock:
            for index, (known, queue, kept) in enumerate(self._routes):
                if known == marker.encode():
                    queue.extend(replies)
                    self._routes[index] = (known, queue, kept if default is None else default)
                    return
            self._routes.append((marker.encode(), deque(replies), default))

    def set_default(self, reply: ScriptedReply | None) -> None:
        with self._lock:
            self._default = reply

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def disconnects(self) -> int:
        """Client disconnects observed while a reply was still streaming or stalled."""
        with self._lock:
            return self._disconnects

    @property
    def connections(self) -> int:
        """TCP connections accepted (a client that reuses its connection opens one)."""
        with self._lock:
            return self._connections

    def wait_for_disconnects(self, count: int = 1, timeout: float = 5.0) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._disconnects >= count, timeout)

    def _next_reply(self, body: bytes = b"") -> ScriptedReply | None:
        with self._lock:
            for marker, queue, default in self._routes:
                if (queue or default is not None) and marker in body:
                    return queue.popleft() if queue else default
            return self._queue.popleft() if self._queue else self._default

    # -- lifecycle --

    def start(self, timeout: float = 5.0) -> FakeProviderServer:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.serve(ready.set)), name="fake-provider", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("fake provider did not start")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> FakeProviderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        """Run until ``stop()``; usable directly on an event loop (process mode)."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    def request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with self._lock:
            self._connections += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while await self._one_request(reader, writer):
                pass
        except (_ClientGone, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:
            # Only ``serve()`` cancels handlers, at shutdown; ending quietly here avoids
            # asyncio's StreamReaderProtocol logging the cancelled task (3.11).
            pass
        finally:
            self._tasks.discard(task)
            writer.transport.abort()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        line = await reader.readline()
        if not line:
            return False
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await self._read_body(reader, headers)
        url = urlsplit(target)
        query = dict(parse_qsl(url.query))
        if url.path.startswith("/__fake__/"):
            await self._control(method, url.path, body, writer)
            return True
        if self.record:
            try:
                # orjson: a stand-in for a remote server should cost the machine little
                # (the bodies of a long tool loop reach hundreds of KiB).
                parsed = orjson.loads(body) if body else None
            except ValueError:
                parsed = None
            with self._lock:
                request = RecordedRequest(method, url.path, query, headers, body, parsed)
                self._requests.append(request)
        if method == "GET" and url.path.endswith("/models"):
            await asyncio.sleep(self.listing_delay)
            while (gate := self.listing_gate) is not None and not gate.is_set():
                await asyncio.sleep(0.01)
            if self.listing_reply is not None:
                return await self._play("listing", self.listing_reply, reader, writer)
            await self._send_json(writer, 200, self._listing(url.path, query, headers))
            return True
        api = _api_for(url.path)
        reply = self._next_reply(body) if method == "POST" and api else None
        if isinstance(reply, Reply) and reply.measure_input:
            usage = dataclasses.replace(reply.usage or FakeUsage(), input_tokens=len(body) // 4)
            reply = dataclasses.replace(reply, usage=usage)
        if api is None or reply is None:
            error = {"error": {"type": "invalid_request_error", "message": "no scripted reply"}}
            await self._send_json(writer, 400 if api else 404, error)
            return True
        return await self._play(api, reply, reader, writer)

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    return bytes(body)
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        length = int(headers.get("content-length", "0"))
        return await reader.readexactly(length) if length else b""

    async def _control(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        if method == "POST" and path == "/__fake__/enqueue":
            self.enqueue(*(reply_from_json(spec) for spec in json.loads(body)))
            await self._send_json(writer, 200, {"ok": True})
        elif method == "POST" and path == "/__fake__/route":
            spec = json.loads(body)
            replies = (reply_from_json(reply) for reply in spec.get("replies", ()))
            default = spec.get("default")
            self.route(
                spec["marker"],
                *replies,
                default=None if default is None else reply_from_json(default),
            )
            await self._send_json(writer, 200, {"ok": True})
        elif path == "/__fake__/requests":
            records = [
                {**asdict(r), "body": r.body.decode("utf-8", "replace")} for r in self.requests
            ]
            await self._send_json(writer, 200, records)
        elif path == "/__fake__/state":
            with self._lock:
                state = {
                    "pending": len(self._queue),
                    "disconnects": self._disconnects,
                    "connections": self._connections,
                }
            await self._send_json(writer, 200, state)
        else:
            await self._send_json(writer, 404, {"error": "unknown control route"})

    def _listing(self, path: str, query: dict[str, str], headers: dict[str, str]) -> Any:
        if "anthropic-version" in headers and path.endswith("/v1/models"):
            limit = min(int(query.get("limit", "20")), self.models_page_size)
            ids = [m.model_id for m in self.models]
            start = ids.index(query["after_id"]) + 1 if query.get("after_id") in ids else 0
            page = self.models[start : start + limit]
            data = [
                {
                    "type": "model",
                    "id": m.model_id,
                    "display_name": m.display_name or m.model_id,
                    "created_at": "2026-01-01T00:00:00Z",
                    "max_input_tokens": m.context_window,
                    "max_tokens": m.max_output_tokens,
                }
                for m in page
            ]
            return {
                "data": data,
                "has_more": start + limit < len(self.models),
                "first_id": page[0].model_id if page else None,
                "last_id": page[-1].model_id if page else None,
            }
        if "client_version" in query:
            models = [
                {
                    "slug": m.model_id,
                    "display_name": m.display_name or m.model_id,
                    "context_window": m.context_window,
                    "visibility": m.visibility,
                    "supported_reasoning_levels": [
                        {"effort": e, "description": e} for e in (m.reasoning_levels or ())
                    ],
                }
                for m in self.models
            ]
            return {"models": models}
        data = [{"id": m.model_id, "object": "model", "owned_by": "fake"} for m in self.models]
        return {"object": "list", "data": data}

    # -- responses --

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        value: Any,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        body = value if isinstance(value, bytes) else json.dumps(value).encode()
        head = [f"HTTP/1.1 {status} Fake", "content-type: application/json"]
        head += [f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in (extra or {}).items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()

    async def _start_stream(
        self, writer: asyncio.StreamWriter, status: int, extra: Mapping[str, str]
    ) -> None:
        head = [f"HTTP/1.1 {status} Fake", "content-type: text/event-stream"]
        head += ["cache-control: no-cache", "transfer-encoding: chunked"]
        head += [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await self._drain(writer)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.drain()
        except ConnectionError:
            self._note_disconnect()
            raise _ClientGone from None

    def _write_chunk(self, writer: asyncio.StreamWriter, frame: bytes) -> None:
        if writer.transport.is_closing():
            self._note_disconnect()
            raise _ClientGone
        writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))

    async def _send_frames(self, writer: asyncio.StreamWriter, frames: list[bytes]) -> None:
        for frame in frames:
            self._write_chunk(writer, frame)
            await self._drain(writer)

    def _note_disconnect(self) -> None:
        with self._lock:
            self._disconnects += 1
            self._lock.notify_all()

    async def _play(
        self,
        api: str,
        reply: ScriptedReply,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if isinstance(reply, HttpError):
            body = reply.body
            if body is None:
                body = {
                    "type": "error",
                    "error": {"type": "api_error", "message": SECRET_PROVIDER_TEXT},
                }
            extra = dict(reply.headers)
            if reply.retry_after is not None:
                extra["retry-after"] = reply.retry_after
            await self._send_json(writer, reply.status, body, extra)
            return True
        if isinstance(reply, RawSSE):
            await self._start_stream(writer, reply.status, {})
            await self._send_frames(writer, list(reply.frames))
            writer.write(b"0\r\n\r\n")
            await self._drain(writer)
            return True
        if isinstance(reply, Fast):
            prelude, delta, tail = _fast_frames(api, reply)
            await self._start_stream(writer, 200, {})
            await self._send_frames(writer, prelude)
            chunk = b"%x\r\n%s\r\n" % (len(delta), delta)
            for i in range(reply.count):
                writer.write(chunk)
                if i % 64 == 63:
                    await self._drain(writer)
            await self._send_frames(writer, tail)
            writer.write(b"0\r\n\r\n")
            await self._drain(writer)
            return True
        plan = _PLANS[api](reply)
        await self._start_stream(writer, 200, reply.headers)
        await self._send_frames(writer, plan.prelude)
        sent = len(plan.text) if reply.after_chunks is None else reply.after_chunks
        for frame in plan.text[:sent]:
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            await self._send_frames(writer, [frame])
        while reply.hold is not None and not reply.hold.is_set():
            await asyncio.sleep(0.01)
        if reply.ending == "complete":
            await self._send_frames(writer, plan.postlude + plan.terminal)
        elif reply.ending == "disconnect":
            writer.transport.abort()
            return False
        elif reply.ending == "stall":
            await self._stall(reader)
            return False
        elif reply.ending == "error_event":
            await self._send_frames(writer, [plan.error])
        elif reply.ending == "malformed":
            await self._send_frames(writer, [b"data: {this is not json\n\n"])
        writer.write(b"0\r\n\r\n")
        await self._drain(writer)
        return True

    async def _stall(self, reader: asyncio.StreamReader) -> None:
        # Hang with the response open until the client closes its end (EOF/reset).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.stall_timeout):
                with contextlib.suppress(ConnectionError):
                    while await reader.read(4096):
                        pass
                self._note_disconnect()


def _load_script(path: str, server: FakeProviderServer) -> None:
    with open(path, encoding="utf-8") as f:
        script = json.load(f)
    if isinstance(script, list):
        script = {"replies": script}
    server.enqueue(*(reply_from_json(r) for r in script.get("replies", [])))
    if script.get("default") is not None:
        server.set_default(reply_from_json(script["default"]))
    if script.get("models") is not None:
        server.models = [FakeModel(**m) for m in script["models"]]


async def _main(args: argparse.Namespace) -> None:
    server = FakeProviderServer(args.host, args.port, record=not args.no_record)
    if args.script:
        _load_script(args.script, server)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)

    def announce() -> None:
        sys.stdout.write(json.dumps({"port": server.port, "base_url": server.base_url}) + "\n")
        sys.stdout.flush()

    await server.serve(announce)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Loopback fake model provider")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file of scripted replies")
    parser.add_argument(
        "--no-record", action="store_true", help="parse and keep no requests (benchmarks)"
    )
    # uvloop, as the service: the stand-in's own overhead is not the service's.
    uvloop.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
