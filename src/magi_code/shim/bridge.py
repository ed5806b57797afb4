"""The stdio shim: ``magi-code --app service`` bridged to the daemon (RFC-0002 §5).

A plain ``selectors`` loop over three file descriptors (stdin, the daemon's socket and a
signal wake-up pipe) drives :class:`~magi_code.shim.core.ShimCore`, which holds every
rule of the bridge: v1 framing, the window of records in flight, acknowledgements after
each stdout write, EOF and exit status. The warm path imports no asyncio: connecting is
blocking (:mod:`magi_code.shim.connect`), stdout is written with blocking ``os.write``
calls, and the daemon's socket is non-blocking.

Protocol output goes to a private duplicate of fd 1; fd 1 itself is pointed at stderr so
that nothing else in the process can corrupt the stream. stdin EOF or SIGTERM/SIGINT
sends ``eof`` (after every record read so far): the daemon cancels and drains this
connection's turns and login, the shim writes their terminal events, then exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import sys
from typing import TYPE_CHECKING, Any

from magi_code.client.errors import DaemonError, DaemonUnavailable
from magi_code.client.handshake import process_launch
from magi_code.endpoint.paths import UnsafeRuntimeDir
from magi_code.protocol.frames import FrameError, encode_frame

from .connect import Link, reach
from .core import ShimCore
from .fallback import announcement, log_fallback, unusable

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    _Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
    # What the bridge replaced, put back when it ends: the wake-up fd and the handlers.
    _Signals = tuple[int, dict[signal.Signals, _Handler]]

READ_CHUNK = 65536


def diagnostic(message: str) -> None:
    """One line on stderr, as the embedded adapter writes them."""
    with contextlib.suppress(OSError):
        os.write(2, f"magi-code: {message}\n".encode())


def serve_shim(in_process: Callable[[], int] | None = None) -> int:
    """Run the v1 service on this process's stdio through the daemon; the exit code.

    When no daemon can be started or reached (:func:`~magi_code.shim.fallback.unusable`)
    and ``in_process`` is given, it serves this process instead, announced once on stderr
    and in the daemon log; nothing of stdin has been read by then. Without it, the shim
    says why and exits 1.
    """
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    launch = process_launch()
    try:
        link = reach(launch)
    except (DaemonUnavailable, DaemonError, UnsafeRuntimeDir) as exc:
        reason = unusable(exc)
        if in_process is None or reason is None:
            # An unsafe runtime directory's message names directories: stderr gets none.
            problem = (
                f"{exc.problem}; `magi-code daemon start` shows where"
                if isinstance(exc, UnsafeRuntimeDir)
                else str(exc)
            )
            diagnostic(f"cannot reach the daemon: {problem}")
            return 1
        # fd 1 back as it was: the in-process service guards its protocol output itself.
        os.dup2(proto_fd, 1)
        os.close(proto_fd)
        sys.stdout = sys.__stdout__
        diagnostic(announcement(reason))
        log_fallback(launch, reason)
        return in_process()
    try:
        return Bridge(link, stdin_fd=0, stdout_fd=proto_fd).run()
    finally:
        link.sock.close()


def write_all(fd: int, data: bytes) -> bool:
    """Write all of ``data`` to ``fd`` (blocking); False once the write fails."""
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:  # someone set O_NONBLOCK on the shared description
                select.select([], [fd], [])
    except OSError:
        return False
    return True


class Bridge:
    """The selectors loop around one :class:`ShimCore`."""

    def __init__(self, link: Link, *, stdin_fd: int, stdout_fd: int) -> None:
        self.core = ShimCore()
        self.sock = link.sock
        self.decoder = link.decoder
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.out = bytearray()  # encoded frames the socket has not taken yet
        self.send_failed = False
        self.stopping = False
        self.selector = selectors.DefaultSelector()
        self.stdin_polled = False  # stdin is registered for reading right now
        self.stdin_pollable = True  # False: a regular file or the like, read directly
        self.sock_events = 0
        self.core.feed_frames(link.frames)
        if link.broken:
            self.core.lost()

    def run(self) -> int:
        core = self.core
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = self._install_signals(wake_w)
        try:
            self.selector.register(wake_r, selectors.EVENT_READ)
            self._after_daemon_input()
            while not core.finished:
                self._watch()
                direct = not self.stdin_pollable and core.wants_stdin
                # (Once the core is finished, whatever else is read is ignored by it.)
                for key, events in self.selector.select(0 if direct else None):
                    if key.fd == wake_r:
                        self._drain_wakeups(wake_r)
                    elif key.fd == self.stdin_fd:
                        self._read_stdin()
                    else:
                        if events & selectors.EVENT_WRITE:
                            self._send()
                        if events & selectors.EVENT_READ:
                            self._read_socket()
                if direct and core.wants_stdin:
                    self._read_stdin()
                if self.stopping and not core.input_ended:
                    core.stop()
                    self._after_stdin_input()
        finally:
            self._restore_signals(previous)
            self.selector.close()
            os.close(wake_r)
            os.close(wake_w)
        assert core.exit_code is not None
        return core.exit_code

    # -- the loop's parts ----------------------------------------------------------------

    def _watch(self) -> None:
        """Register interest in what the core can take next."""
        want_stdin = self.core.wants_stdin and self.stdin_pollable
        if want_stdin != self.stdin_polled:
            if want_stdin:
                try:
                    self.selector.register(self.stdin_fd, selectors.EVENT_READ)
                except (OSError, ValueError):  # epoll refuses regular files, /dev/null
                    self.stdin_pollable = False
                    want_stdin = False
            else:
                self.selector.unregister(self.stdin_fd)
            self.stdin_polled = want_stdin
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0)
        if events != self.sock_events:
            if self.sock_events:
                self.selector.modify(self.sock, events)
            else:
                self.selector.register(self.sock, events)
            self.sock_events = events

    def _read_stdin(self) -> None:
        try:
            data = os.read(self.stdin_fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # an unreadable stdin ends the input, as EOF does
        self.core.feed_stdin(data)
        self._after_stdin_input()

    def _read_socket(self) -> None:
        core = self.core
        try:
            data = self.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            core.lost()
        else:
            try:
                frames = self.decoder.feed(data)
            except FrameError as exc:
                core.feed_frames(exc.decoded)
                core.lost()
            else:
                core.feed_frames(frames)
        self._after_daemon_input()

    def _after_daemon_input(self) -> None:
        core = self.core
        if core.needs_write:
            # Every output frame of this read in one write; their acknowledgements (and
            # only then any further record) are queued after it.
            data = core.stdout
            core.wrote(write_all(self.stdout_fd, data) if data else True)
        self._flush()

    def _after_stdin_input(self) -> None:
        self._flush()

    def _flush(self) -> None:
        core = self.core
        for line in core.take_diagnostics():
            diagnostic(line)
        frames = core.take_frames()
        if frames:
            self.out += b"".join(map(encode_frame, frames))
        if self.out:
            self._send()

    def _send(self) -> None:
        if self.send_failed:
            self.out.clear()
            return
        try:
            while self.out:
                sent = self.sock.send(self.out)
                del self.out[:sent]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # The daemon is gone; reading the socket tells whether it said ``end`` first.
            self.send_failed = True
            self.out.clear()

    # -- signals ---------------------------------------------------------------------------

    def _install_signals(self, wake_w: int) -> _Signals | None:
        def stop(_signum: int, _frame: FrameType | None) -> None:
            self.stopping = True

        try:
            wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (an embedding caller): no signals here
            return None
        return wakeup, {signum: signal.signal(signum, stop) for signum in _STOP_SIGNALS}

    @staticmethod
    def _restore_signals(previous: _Signals | None) -> None:
        if previous is None:
            return
        wakeup, handlers = previous
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(wakeup)

    @staticmethod
    def _drain_wakeups(fd: int) -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 256):
                pass


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
