"""The v1 stdio adapter: JSONL in on stdin, JSONL out on stdout, diagnostics on stderr.

The adapter owns framing and writing only; the v1 rules are ``core/v1.py``'s. It feeds
each input record to :class:`V1Connection` (which handles the next one only once the
answer to it is written to stdout) and writes each take of batches (:func:`next_take`)
with one ``write``, settling each batch in order only then. A write counts once the
kernel took every byte of it (the pipe transport buffers nothing between writes), as the
shim's blocking writes do. On EOF (or SIGTERM) it asks the coordinator to cancel and
drain the connection's work, writes the remaining batches while stdout is open, and
returns.

Output failures stop the writer: a batch that cannot be encoded is never written (the
batches before it in the same write are), and a failed write settles every batch it
carried; either prints one diagnostic, closes the output (settling what is still queued)
and makes the exit status 1.

Protocol output goes to a private duplicate of fd 1; fd 1 itself is pointed at stderr so
that nothing else in the process (or a child that inherits it) can corrupt the stream.

Before anything else, embedded mode checks ``MC_HOME`` as the daemon path does for its
state directory (:func:`check_home`): an unsafe home ends the process with one stderr line
(naming no path) and exit status 1, as the shim does when the daemon cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Protocol

from magi_code.core.coordinator import Connection, ServiceCoordinator
from magi_code.core.output import Output
from magi_code.core.v1 import V1Connection, next_take
from magi_code.endpoint.paths import UnsafeRuntimeDir, ensure_private_dir
from magi_code.protocol.framing import LineFramer
from magi_code.storage.launch import LaunchContext
from magi_code.turns.failures import describe

READ_CHUNK = 65536
EXIT_UNSAFE_HOME: Final = 1


class ByteReader(Protocol):
    async def read(self, n: int) -> bytes: ...


class ByteWriter(Protocol):
    async def write(self, data: bytes) -> None: ...


class _PipeReader:
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def read(self, n: int) -> bytes:
        return await self._reader.read(n)


class _ThreadReader:
    """For stdin that is a regular file, where pipe transports are unavailable."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def read(self, n: int) -> bytes:
        return await asyncio.to_thread(os.read, self._fd, n)


class _PipeWriter:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()


class _ThreadWriter:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def write(self, data: bytes) -> None:
        await asyncio.to_thread(_write_all, self._fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pollable(fd: int) -> bool:
    # Only pipes and sockets go to the event loop: uvloop aborts the process when epoll
    # refuses an fd (regular files, /dev/null), so everything else uses a thread.
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def open_reader(fd: int) -> ByteReader:
    if not _pollable(fd):
        return _ThreadReader(fd)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK * 2)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0, closefd=False)
    )
    return _PipeReader(reader)


async def open_writer(fd: int) -> ByteWriter:
    if not _pollable(fd):
        return _ThreadWriter(fd)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", 0, closefd=False)
    )
    # Without water marks drain() returns only once the buffer is empty: a write is done
    # when the kernel has all of it (an answer held in this process is not written).
    transport.set_write_buffer_limits(0)
    return _PipeWriter(asyncio.StreamWriter(transport, protocol, None, loop))


def diagnostic(message: str) -> None:
    """One line on stderr; never request data, secrets or paths."""
    with contextlib.suppress(OSError):
        os.write(2, f"magi-code: {message}\n".encode())


async def write_loop(output: Output, writer: ByteWriter) -> bool:
    """Write batches until the channel ends. False after an output failure."""
    while (take := await next_take(output)) is not None:
        if take.batches:
            try:
                data = take.data
                await writer.write(data[0] if len(data) == 1 else b"".join(data))
            except (OSError, ConnectionError, RuntimeError):
                diagnostic("output error: stdout closed; stopping")
                for batch in take.batches:
                    batch.written()
                output.close()
                return False
            for batch in take.batches:
                batch.written()
                for turn_id, label, remedy in batch.failures():
                    diagnostic(describe(turn_id, label, remedy))
        if take.failure is not None:
            diagnostic(f"output error: {take.failure}; stopping")
            return False
    return True


class StopSignal:
    """SIGTERM/SIGINT for the input pump: a read in progress ends as at EOF, and no
    further read starts. Costs nothing per read (no extra task or future)."""

    def __init__(self) -> None:
        self._set = False
        self._reading: asyncio.Task[object] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._reading is not None:
            self._reading.cancel()

    async def read(self, reader: ByteReader) -> bytes:
        """The next chunk of input, or ``b\"\"`` (as at EOF) once stopped."""
        if self._set:
            return b""
        task = asyncio.current_task()
        assert task is not None
        self._reading = task
        try:
            return await reader.read(READ_CHUNK)
        except asyncio.CancelledError:
            # Ours only if stopped and nobody else cancelled the task too.
            if not self.is_set() or task.uncancel() > 0:
                raise
            return b""
        finally:
            self._reading = None


async def pump_input(
    coordinator: ServiceCoordinator,
    conn: Connection,
    reader: ByteReader,
    writer_task: asyncio.Task[bool],
    stop: StopSignal,
) -> None:
    records = V1Connection(coordinator, conn, writer_task)
    framer = LineFramer()
    while not stop.is_set():
        chunk = await stop.read(reader)
        for frame in framer.feed(chunk) if chunk else framer.eof():
            if not await records.feed(frame):
                return
        if not chunk:
            return


def check_home(mc_home: Path) -> str | None:
    """Why the service must not keep its state in ``mc_home`` (one line, naming no path:
    it goes to the frontend's stderr), or None.

    The daemon only starts once ``$MC_HOME/run`` is private and every ancestor of it is
    owned by root or us and not writable by others (``ensure_private_dir``); embedded mode
    keeps sessions, credentials and settings in ``MC_HOME`` itself, so it requires the
    equivalent of the home. The ancestors of the given path and of the resolved one must
    be owned by root or us and not writable by others unless sticky (like ``/tmp``); they
    are checked before a missing home is created (mode 0700, with any missing parents).
    The home itself, after resolving symlinks (as the daemon resolves ``MC_HOME``), must
    be a directory owned by us that neither group nor others can write.
    """
    if not mc_home.is_absolute():
        return "MC_HOME is not an absolute path"
    existing = mc_home.parent
    while not os.path.lexists(existing):
        existing = existing.parent
    # The existing ancestors of the home (or of the directory holding a symlinked home).
    base = Path(os.path.realpath(existing))
    if (problem := _unsafe_ancestor([base, *base.parents])) is not None:
        return problem
    try:
        if not os.path.lexists(mc_home):
            ensure_private_dir(mc_home)
        real = Path(os.path.realpath(mc_home))
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except UnsafeRuntimeDir:
        return "MC_HOME could not be created as a private directory"
    except OSError as exc:
        return f"MC_HOME is not a directory we can open ({exc.strerror})"
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    euid = os.geteuid()
    if st.st_uid != euid:
        return f"MC_HOME is owned by uid {st.st_uid}, not {euid}"
    if st.st_mode & 0o022:
        return (
            f"MC_HOME is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            "remove that permission (chmod go-w)"
        )
    return _unsafe_ancestor(list(real.parents))


def _unsafe_ancestor(ancestors: list[Path]) -> str | None:
    euid = os.geteuid()
    for ancestor in ancestors:
        try:
            info = os.stat(ancestor)
        except OSError as exc:
            return f"a directory above MC_HOME cannot be checked ({exc.strerror})"
        if info.st_uid not in (0, euid):
            return f"a directory above MC_HOME is owned by uid {info.st_uid}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return "a directory above MC_HOME is writable by others; remove that permission"
    return None


async def serve_stdio(
    build: Callable[[LaunchContext], Awaitable[ServiceCoordinator]], ctx: LaunchContext
) -> int:
    """Run the v1 service on this process's stdio. Returns the process exit code."""
    problem = await asyncio.to_thread(check_home, ctx.mc_home)
    if problem is not None:
        diagnostic(f"unsafe MC_HOME: {problem}")
        return EXIT_UNSAFE_HOME
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    coordinator = await build(ctx)
    conn = coordinator.open_connection(ctx)
    reader = await open_reader(0)
    writer = await open_writer(proto_fd)
    writer_task = asyncio.create_task(write_loop(conn.output, writer))
    stop = StopSignal()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    try:
        await pump_input(coordinator, conn, reader, writer_task, stop)
    finally:
        # EOF or signal: cancel and drain this connection's work, then flush what remains.
        await coordinator.close_connection(conn)
        ok = await writer_task
    return 0 if ok else 1
