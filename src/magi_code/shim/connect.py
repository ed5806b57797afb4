"""The shim's connection to the daemon: blocking, with no asyncio on the warm path.

:func:`reach` connects to the daemon of ``ctx.mc_home`` (the socket recorded in
``daemon.json``, else the default path), checks the socket's directory and the daemon's
UID before writing a byte, and says hello as ``v1_shim`` with the launch context and this
build's ``build_id``. Only when no daemon answers (nothing listens, or it refused as
``draining``) does it start one through the client's asyncio starter, then connect again
without ``build_id``: a daemon that was just found or started is never asked to make way.

The hello, the failures and the meaning of the daemon's answer are the client's own
(:mod:`magi_code.client.handshake`), so every message matches the asyncio client's.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from magi_code.client.errors import DaemonError, DaemonUnavailable
from magi_code.client.handshake import (
    CONNECT_TIMEOUT,
    check_socket_dir,
    closed_early,
    connect_failure,
    foreign_peer,
    hello_frame,
    invalid_frames,
    no_answer,
    socket_for,
    welcome_of,
)
from magi_code.endpoint.peer import check_peer
from magi_code.protocol.frames import FrameDecoder, FrameError, encode_frame
from magi_code.storage.launch import LaunchContext
from magi_code.version import build_id

CLIENT_NAME = "shim"
READ_CHUNK = 65536
START_ATTEMPTS = 3  # a daemon may go idle between its start and our connect


@dataclass
class Link:
    """A handshaken connection: the socket, the welcome, and what came after it."""

    sock: socket.socket
    welcome: dict[str, Any]
    decoder: FrameDecoder
    frames: list[dict[str, Any]] = field(default_factory=list)  # read with the welcome
    broken: bool = False  # invalid bytes followed those frames


def reach(ctx: LaunchContext) -> Link:
    """Connect to this home's daemon, starting it when none answers.

    Raises ``DaemonUnavailable``/``DaemonError`` (and ``UnsafeRuntimeDir``) with the
    operator line to print.
    """
    try:
        # Only a client that will use this daemon asks one of another build to make way.
        return connect(ctx, build=build_id())
    except DaemonUnavailable:
        pass
    return _start_and_connect(ctx)


def connect(ctx: LaunchContext, *, build: str | None, timeout: float = CONNECT_TIMEOUT) -> Link:
    """One connection attempt (no start): the :class:`Link`, or the error it met."""
    path = socket_for(ctx)
    check_socket_dir(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except OSError as exc:
            raise connect_failure(exc, path, timeout) from None
        if not check_peer(sock):
            raise foreign_peer()
        hello = hello_frame("v1_shim", ctx, client_name=CLIENT_NAME, build=build)
        return _handshake(sock, encode_frame(hello), time.monotonic() + timeout, timeout)
    except BaseException:
        sock.close()
        raise


def _handshake(sock: socket.socket, hello: bytes, deadline: float, timeout: float) -> Link:
    decoder = FrameDecoder()
    frames: list[dict[str, Any]] = []
    broken = False
    try:
        sock.sendall(hello)
        for data in _chunks(sock, deadline):
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                frames, broken = exc.decoded, True
                if not frames:
                    raise invalid_frames() from None
            if frames:
                break
    # TimeoutError is an OSError: it must come first.
    except TimeoutError:
        raise no_answer(timeout) from None
    except OSError:
        raise closed_early() from None
    welcome = welcome_of(frames[0] if frames else None)
    sock.setblocking(False)
    return Link(sock, welcome, decoder, frames[1:], broken)


def _chunks(sock: socket.socket, deadline: float) -> Iterator[bytes]:
    """What the daemon sends, until it closes the connection or ``deadline`` passes."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        data = sock.recv(READ_CHUNK)
        if not data:
            return
        yield data


def _start_and_connect(ctx: LaunchContext) -> Link:
    """No daemon answered: start one (the client's starter, asyncio), then connect."""
    import asyncio

    from magi_code.client.starter import DaemonStartError, ensure_daemon

    for _ in range(START_ATTEMPTS):
        try:
            asyncio.run(ensure_daemon(ctx))
        except DaemonStartError as exc:
            raise DaemonError(str(exc)) from None
        try:
            # The daemon ensure_daemon found or started: never ask it to make way again.
            return connect(ctx, build=None)
        except DaemonUnavailable:
            continue
    raise DaemonUnavailable("the daemon stopped while connecting")
