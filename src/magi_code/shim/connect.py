"""The shim's connection to the daemon: blocking, with no asyncio on the warm path.

:func:`reach` connects to the daemon of ``launch.mc_home`` (the socket recorded in
``daemon.json``, else the default path), checks the socket's directory and the daemon's
UID before writing a byte, and says hello as ``v1_shim`` with the launch context and this
build's ``build_id``. Only when no daemon answers (nothing listens, or it refused as
``draining``) does it start one through the client's blocking starter, which connects
with this same hello, without ``build_id`` once it started one: a daemon that was just
found or started is never asked to make way.

The hello, the failures and the meaning of the daemon's answer are the client's own
(:mod:`magi_code.client.handshake`), so every message matches the asyncio client's.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from magi_code.client.errors import DaemonError, DaemonUnavailable
from magi_code.client.handshake import (
    answer_timeout,
    check_socket_dir,
    closed_early,
    connect_failure,
    context_of,
    daemon_socket,
    foreign_peer,
    hello_frame,
    invalid_frames,
    no_answer,
    welcome_of,
)
from magi_code.endpoint.peer import check_peer
from magi_code.protocol.frames import FrameDecoder, FrameError, encode_frame
from magi_code.protocol.v2 import Launch
from magi_code.version import build_id

CLIENT_NAME = "shim"
READ_CHUNK = 65536
# A daemon that failed to start reported a reason that may name files, and the frontend's
# stderr gets no host paths: ``magi-code daemon start`` shows the reason in full.
START_FAILED = "the daemon could not start; `magi-code daemon start` shows why"


class StartFailed(DaemonError):
    """No daemon answered and none could be started (the starter's reason)."""


class Link:
    """A handshaken connection: the socket, the welcome, and what came after it."""

    __slots__ = ("broken", "decoder", "frames", "sock", "welcome")

    def __init__(
        self,
        sock: socket.socket,
        welcome: dict[str, Any],
        decoder: FrameDecoder,
        frames: list[dict[str, Any]],
        broken: bool,
    ) -> None:
        self.sock = sock
        self.welcome = welcome
        self.decoder = decoder
        self.frames = frames  # read with the welcome
        self.broken = broken  # invalid bytes followed those frames


def reach(launch: Launch) -> Link:
    """Connect to this home's daemon, starting it when none answers.

    Raises ``DaemonError`` (:class:`StartFailed` when the start failed), whose message is
    the line to print (it names no path), or ``UnsafeRuntimeDir``, whose ``problem`` is
    (its message names directories).
    """
    try:
        # Only a client that will use this daemon asks one of another build to make way.
        return connect(launch, build=build_id())
    except DaemonUnavailable:
        pass
    return _start_and_connect(launch)


def connect(launch: Launch, *, build: str | None) -> Link:
    """One connection attempt (no start): the :class:`Link`, or the error it met."""
    timeout = answer_timeout(launch.env)
    path = daemon_socket(launch.mc_home, launch.env)
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
        hello = hello_frame("v1_shim", launch, client_name=CLIENT_NAME, build=build)
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


def _start_and_connect(launch: Launch) -> Link:
    """No daemon answered: start one (the client's blocking starter) and connect to it."""
    from magi_code.client.starter import DaemonFailedToStart, DaemonStartError, start_daemon

    try:
        # Our own hello is the starter's probe, so the daemon it found or started serves
        # this connection (never asked to make way once started: build None).
        return start_daemon(
            context_of(launch), lambda build: connect(launch, build=build), probed=True
        )
    except DaemonFailedToStart:
        raise StartFailed(START_FAILED) from None  # its reason may name files
    except DaemonStartError as exc:
        raise StartFailed(str(exc)) from None
