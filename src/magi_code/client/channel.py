"""The raw v2 frame channel: connect, check the daemon's UID, hello/welcome, frames.

The stdio shim uses it directly; :class:`~magi_code.client.connection.Client` adds
request/response correlation on top.

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
import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from magi_code.endpoint.paths import read_info, runtime_paths, verify_private_dir
from magi_code.endpoint.peer import check_peer
from magi_code.protocol.frames import FrameDecoder, FrameError, encode_frame
from magi_code.protocol.v2 import Launch, Role, hello
from magi_code.storage.launch import LaunchContext
from magi_code.version import package_version

from .errors import DaemonDraining, DaemonError, DaemonTimeout, DaemonUnavailable, ForeignDaemon

# A daemon that accepted the connection answers hello in milliseconds; one that does not
# within this bound is stopped (SIGSTOP) or wedged.
CONNECT_TIMEOUT = 3.0
READ_CHUNK = 65536


def launch_of(ctx: LaunchContext) -> Launch:
    return Launch(str(ctx.mc_home), str(ctx.project_dir), dict(ctx.env), ctx.umask)


def _seconds(value: float) -> str:
    return f"{value:g} s"


def socket_for(ctx: LaunchContext) -> Path:
    """The socket the daemon of ``ctx.mc_home`` bound (from ``daemon.json``), or the default."""
    paths = runtime_paths(ctx)
    info = read_info(paths)
    recorded = info.get("socket") if info else None
    return Path(recorded) if isinstance(recorded, str) else paths.socket


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
        try:
            verify_private_dir(socket_path.parent)
        except FileNotFoundError:
            raise DaemonUnavailable("no daemon is running") from None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(socket_path), limit=READ_CHUNK * 2), timeout
            )
        # TimeoutError and BlockingIOError are OSErrors: they must come first.
        except TimeoutError:
            raise DaemonTimeout(
                f"the daemon did not accept the connection within {_seconds(timeout)}"
            ) from None
        except BlockingIOError:  # a full backlog: a listener that does not accept
            raise DaemonTimeout("the daemon is not accepting connections") from None
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
            raise DaemonUnavailable("no daemon is running") from None
        except PermissionError:
            if _owner(socket_path) not in (None, os.geteuid()):
                raise ForeignDaemon("the socket is served by another user") from None
            raise DaemonUnavailable("the daemon socket cannot be opened") from None
        except OSError as exc:
            raise DaemonUnavailable(f"cannot connect to the daemon ({exc.strerror})") from None
        sock = writer.get_extra_info("socket")
        if sock is None or not check_peer(sock):
            writer.close()
            raise ForeignDaemon("the socket is served by another user; refusing to use it")
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
        launch_frame = None if launch is None else launch_of(launch)
        frame = hello(role, launch_frame, client_name, package_version(), options, build)

        async def exchange() -> dict[str, Any] | None:
            await channel.send(frame)
            return await channel.recv()

        try:
            first = await asyncio.wait_for(exchange(), timeout)
        # TimeoutError is an OSError: it must come first.
        except TimeoutError:
            channel.abort()
            raise DaemonTimeout(
                f"the daemon did not answer the handshake within {_seconds(timeout)}"
            ) from None
        except (ConnectionError, OSError):
            await channel.close()
            raise DaemonUnavailable("the daemon closed the connection") from None
        except DaemonError:
            await channel.close()
            raise
        if first is None:
            await channel.close()
            raise DaemonUnavailable("the daemon closed the connection")
        if first.get("t") == "refused":
            await channel.close()
            code = first.get("code")
            if code == "draining":
                raise DaemonDraining("the daemon is stopping")
            if code == "tool_process":
                raise DaemonError(
                    "the daemon refused the connection (tool_process): commands run by the "
                    "agent's tools cannot use the daemon",
                    code,
                )
            raise DaemonError(f"the daemon refused the connection ({code})", _code(code))
        if first.get("t") != "welcome":
            await channel.close()
            raise DaemonError("the daemon answered with an unexpected frame", "protocol_error")
        channel.welcome = first
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
                raise DaemonError("the daemon sent an invalid frame", "framing_error")
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


def _code(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _owner(path: Path) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None
