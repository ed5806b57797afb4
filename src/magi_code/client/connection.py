"""Typed async client for the magi-code daemon (protocol v2, RFC-0002).

:class:`Client` adds request/response correlation and event iteration for
``persistent`` and ``control`` connections on a :class:`~magi_code.client.channel.Channel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any

from magi_code.protocol import envelope
from magi_code.protocol.v2 import Role
from magi_code.storage.launch import LaunchContext

from .channel import Channel, socket_for
from .errors import DaemonError, DaemonUnavailable, DeadlineExceeded
from .starter import ensure_daemon


class Client:
    """A ``persistent`` (or ``control``) connection with request/response correlation.

    Example::

        async with await Client.connect(LaunchContext.from_process()) as client:
            await client.request("initialize", {"supported_protocol_versions": [1]})
            reply = await client.request("turn.start", {"prompt": "hi"})
            async for event in client.events():
                if event["event"] == "turn.terminal":
                    break
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._waiting: dict[tuple[str, Any], asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(
        cls,
        ctx: LaunchContext,
        role: Role = "persistent",
        *,
        autostart: bool = True,
        client_name: str = "magi_code.client",
        delta_interval_ms: int = 0,
    ) -> Client:
        """Connect to the daemon of ``ctx.mc_home``, starting it on demand if allowed.

        ``delta_interval_ms`` (0..10000) asks the daemon to merge a turn's assistant
        deltas so they arrive at most once per interval (RFC-0002 §6.3).
        """
        options = {"delta_interval_ms": delta_interval_ms} if delta_interval_ms else None
        channel = await connect_channel(
            ctx, role, autostart=autostart, client_name=client_name, options=options
        )
        return cls(channel)

    @property
    def welcome(self) -> dict[str, Any]:
        return self.channel.welcome

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        payload: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        deadline_ms: int | None = None,
    ) -> dict[str, Any]:
        """Send a v1 request envelope; returns its v1 response envelope.

        ``deadline_ms`` (Unix time in milliseconds): if the daemon reaches the request
        only after it, the request does not run and :class:`DeadlineExceeded` is raised.
        """
        rid = request_id or f"c-{next(self._ids)}"
        message = envelope.request(rid, method, payload, session_id)
        frame: dict[str, Any] = {"t": "request", "message": message}
        if deadline_ms is not None:
            frame["deadline_ms"] = deadline_ms
        return await self._call(("response", rid), frame)

    async def control(self, op: str) -> dict[str, Any]:
        """``status`` or ``stop``; returns the result map."""
        frame = await self._call_id("control_result", {"t": "control", "op": op})
        result: dict[str, Any] = frame["result"]
        return result

    async def snapshot(self) -> list[dict[str, Any]]:
        """Running and recently finished turns this daemon knows (RFC-0002 §6)."""
        frame = await self._call_id("snapshot_result", {"t": "snapshot"})
        turns: list[dict[str, Any]] = frame["turns"]
        return turns

    async def attach(self, turn_id: str, after_sequence: int = -1) -> dict[str, Any]:
        """Follow a turn: buffered events after ``after_sequence``, then live events."""
        frame = await self._call_id(
            "attach_result",
            {"t": "attach", "turn_id": turn_id, "after_sequence": after_sequence},
        )
        return frame

    async def take_control(self, session_id: str) -> dict[str, Any]:
        """Become the session's controller (RFC-0002 §6.1).

        Takes over a session held by a lost persistent client, with its running turn
        (which this connection may then cancel), or opens a free one. Returns the
        ``control_granted`` frame (``turns``: running turns with their last sequence);
        raises :class:`DaemonError` with ``code`` (e.g. ``session_busy``) otherwise.
        """
        frame = {"t": "take_control", "session_id": session_id}
        return await self._call_id("control_granted", frame)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """v1 event envelopes as they arrive; ends when the connection closes.

        The daemon's overload notice (RFC-0002 §6.2) arrives here too, as
        ``{"kind": "overloaded", "event": "overloaded", "payload": {"turn_id": ...,
        "after_sequence": k}}``: no more live events of that turn follow; resync with
        ``attach(turn_id, k)``.
        """
        while (event := await self._events.get()) is not None:
            yield event

    async def close(self) -> None:
        await self.channel.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, DaemonError):
            await self._reader

    async def _call_id(self, kind: str, frame: dict[str, Any]) -> dict[str, Any]:
        frame_id = next(self._ids)
        return await self._call((kind, frame_id), {**frame, "id": frame_id})

    async def _call(self, key: tuple[str, Any], frame: dict[str, Any]) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            await self.channel.send(frame)
            return await future
        finally:
            self._waiting.pop(key, None)

    async def _read(self) -> None:
        try:
            while (frame := await self.channel.recv()) is not None:
                self._dispatch(frame)
        finally:
            self._events.put_nowait(None)
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(DaemonUnavailable("the daemon closed the connection"))

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("t")
        if kind == "message":
            message = frame.get("message")
            if not isinstance(message, dict):
                return
            if message.get("kind") == "response":
                future = self._waiting.get(("response", message.get("request_id")))
                if future is not None and not future.done():
                    future.set_result(message)
                    return
            self._events.put_nowait(message)
            return
        if kind == "overloaded":
            payload = {k: frame.get(k) for k in ("turn_id", "after_sequence")}
            notice = {"kind": "overloaded", "event": "overloaded", "payload": payload}
            self._events.put_nowait(notice)
            return
        code = frame.get("code")
        code = code if isinstance(code, str) else None
        if kind == "request_error":
            future = self._waiting.get(("response", frame.get("request_id")))
            error = DeadlineExceeded if code == "deadline_exceeded" else DaemonError
            if future is not None and not future.done():
                future.set_exception(error(f"request rejected ({code})", code))
            return
        if kind in ("control_error", "attach_error", "grant_error"):
            for answer in ("control_result", "attach_result", "control_granted"):
                future = self._waiting.get((answer, frame.get("id")))
                if future is not None and not future.done():
                    future.set_exception(DaemonError(f"request failed ({code})", code))
            return
        future = self._waiting.get((str(kind), frame.get("id")))
        if future is not None and not future.done():
            future.set_result(frame)


async def connect_channel(
    ctx: LaunchContext,
    role: Role,
    *,
    autostart: bool,
    client_name: str = "magi_code.client",
    options: Mapping[str, Any] | None = None,
) -> Channel:
    """Connect to the daemon for ``ctx``; with ``autostart`` start it when none answers."""
    launch = None if role == "control" else ctx

    async def attempt() -> Channel:
        return await Channel.open(
            socket_for(ctx), role, launch, client_name=client_name, options=options
        )

    try:
        return await attempt()
    except DaemonUnavailable:
        if not autostart:
            raise
    for _ in range(3):  # a daemon may go idle between its start and our connect
        await ensure_daemon(ctx)
        with contextlib.suppress(DaemonUnavailable):
            return await attempt()
    raise DaemonUnavailable("the daemon stopped while connecting")
