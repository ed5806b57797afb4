"""The raw v2 frame channel: connect, check the daemon's UID, hello/welcome, frames.

:class:`~magi_code.client.connection.Client` adds request/response correlation on top.
The hello, the connect failures and the meaning of the daemon's answer come from
:mod:`~magi_code.client.handshake`, which the stdio shim's blocking connect uses too.

Connecting fails with one of: :class:`DaemonUnavailable` (no daemon: nothing listens;
:class:`DaemonDraining` when it is stopping), :class:`DaemonTimeout` (something listens
but did not accept or answer ``hello`` within ``timeout`` seconds: stopped, wedged or
overloaded), :class:`ForeignDaemon` (the socket is served by another user), or
:class:`DaemonError` (a refusal such as ``wrong_home``). Every hello names the client's
``MC_HOME`` (a control hello names nothing else), so a daemon of another home refuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from magi_code.endpoint.peer import check_peer
from magi_code.protocol.frames import FrameDecoder, FrameError, encode_frame
from magi_code.protocol.v2 import Role
from magi_code.storage.launch import LaunchContext

from .errors import DaemonError, DaemonUnavailable
from .handshake import (
    CONNECT_TIMEOUT,
    check_socket_dir,
    closed_early,
    connect_failure,
    foreign_peer,
    hello_frame,
    invalid_frames,
    launch_of,
    no_answer,
    socket_for,
    welcome_of,
)

__all__ = ["CONNECT_TIMEOUT", "Channel", "launch_of", "socket_for"]

READ_CHUNK = 65536
# Between tries to connect while the daemon's listen backlog is full.
BACKLOG_RETRY_SECONDS: Final = 0.02


class Channel:
    """A connected, handshaken v2 connection (use :meth:`open`)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, welcome: dict[str, Any]
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder()
        self._frames: deque[dict[str, Any]] = deque()
        self._broken = False
        self.welcome = welcome

    @classmethod
    async def open(
        cls,
        socket_path: Path,
        role: Role,
        launch: LaunchContext | None,
        *,
        client_name: str = "magi_code.client",
        timeout: float = CONNECT_TIMEOUT,
        options: Mapping[str, Any] | None = None,
        build: str | None = None,
    ) -> Channel:
        """Connect, check the daemon's UID before writing a byte, and do the handshake.

        ``options`` go into ``hello`` (RFC-0002 §3), e.g. ``{"delta_interval_ms": 50}``.
        ``build`` (this client's ``build_id``) asks a daemon of another build to make way
        (RFC-0002 §3): an idle one refuses as ``draining`` and stops, a busy one serves
        and stops once idle.
        """
        check_socket_dir(socket_path)
        try:
            reader, writer = await _open(socket_path, timeout)
        except OSError as exc:
            raise connect_failure(exc, socket_path, timeout) from None
        sock = writer.get_extra_info("socket")
        if sock is None or not check_peer(sock):
            writer.close()
            raise foreign_peer()
        return await cls.handshake(
            reader,
            writer,
            role,
            launch,
            client_name=client_name,
            timeout=timeout,
            options=options,
            build=build,
        )

    @classmethod
    async def handshake(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        role: Role,
        launch: LaunchContext | None,
        *,
        client_name: str = "magi_code.client",
        timeout: float = CONNECT_TIMEOUT,
        options: Mapping[str, Any] | None = None,
        build: str | None = None,
    ) -> Channel:
        """Say hello on an already connected stream and wait for ``welcome``.

        :meth:`open` calls this after its peer checks; call it directly only on a stream
        whose other end you trust already (a ``socketpair`` in tests, a proxy you run).
        """
        channel = cls(reader, writer, {})
        frame = hello_frame(role, launch, client_name=client_name, options=options, build=build)

        async def exchange() -> dict[str, Any] | None:
            await channel.send(frame)
            return await channel.recv()

        try:
            first = await asyncio.wait_for(exchange(), timeout)
        # TimeoutError is an OSError: it must come first.
        except TimeoutError:
            channel.abort()
            raise no_answer(timeout) from None
        except (ConnectionError, OSError):
            await channel.close()
            raise closed_early() from None
        except DaemonError:
            await channel.close()
            raise
        try:
            channel.welcome = welcome_of(first)
        except (DaemonError, DaemonUnavailable):
            await channel.close()
            raise
        return channel

    async def send(self, frame: Mapping[str, Any]) -> None:
        self._writer.write(encode_frame(frame))
        await self._writer.drain()

    async def recv(self) -> dict[str, Any] | None:
        """The next frame, or None at end of stream.

        Bytes that are not valid v2 framing raise :class:`DaemonError` (``framing_error``)
        once the valid frames before them have been returned.
        """
        while not self._frames:
            if self._broken:
                raise invalid_frames()
            data = await self._reader.read(READ_CHUNK)
            if not data:
                with contextlib.suppress(FrameError):
                    self._decoder.eof()
                return None
            try:
                self._frames.extend(self._decoder.feed(data))
            except FrameError as exc:
                self._frames.extend(exc.decoded)
                self._broken = True
        return self._frames.popleft()

    def abort(self) -> None:
        """Close the transport now (no waiting); for a reader that found a protocol error."""
        self._writer.close()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


async def _open(
    socket_path: Path, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect within ``timeout``.

    The socket is connected here, not by asyncio: on a full listen backlog a non-blocking
    ``AF_UNIX`` connect fails with ``EAGAIN`` and asyncio would wait for the socket to be
    writable and take it as connected when it is not (its peer credentials then read as
    nobody's). A full backlog is tried again: a daemon accepting a burst of connections
    drains it within milliseconds, and only one that stopped accepting runs out the
    timeout.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(socket_path))
            break
        except BlockingIOError as exc:
            sock.close()
            if exc.errno != errno.EAGAIN or loop.time() + BACKLOG_RETRY_SECONDS >= deadline:
                raise
        except BaseException:
            sock.close()
            raise
        await asyncio.sleep(BACKLOG_RETRY_SECONDS)
    try:
        return await asyncio.wait_for(
            asyncio.open_unix_connection(sock=sock, limit=READ_CHUNK * 2),
            max(deadline - loop.time(), 0),
        )
    except BaseException:
        sock.close()
        raise
