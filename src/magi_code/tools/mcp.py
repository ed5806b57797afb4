"""MCP servers over stdio, exposed as tools, through the official ``mcp`` SDK (2.x).

Theory of operation: each server gets one runner task (``_ServerConnection``) that owns
the SDK's ``stdio_client`` and ``ClientSession`` contexts (anyio cancel scopes must be
entered and left by the same task). The runner starts the server in the project
directory with the stripped child environment plus the server's own ``env``, under the
client's umask, initializes, lists its tools (following pagination, bounded), then parks
until it is told to stop. Tool calls, and re-listing after the server's
``notifications/tools/list_changed``, use the session from the calling task; the session
multiplexes concurrent requests, so several turns may call one server at once. Because
nothing of a server lives in a caller's task, a server that fails to start, hangs, or
dies affects only its own tools, a cancelled caller abandons only its own request, and a
server may be kept running across turns and stopped from any task.

Two owners of servers:

- :class:`McpToolset`: the servers of one use (``async with``), started on entry and
  stopped on exit;
- :class:`McpServers`: the service's warm servers. A turn takes a :class:`McpLease` on
  the servers its settings configure; a server is keyed by a fingerprint of its
  definition and of what it is started with (the launch environment after stripping,
  the project directory, the umask), started by the first lease that needs it and
  reused by later ones. It is restarted when it died or failed to start, replaced when
  the fingerprint changes (the owner's old server stops once no turn uses it), stopped
  when the last connection that used it closes and no turn uses it, and stopped after
  :data:`IDLE_STOP_SECONDS` without a turn using it (a detached connection's servers
  linger for that period: its turns may still run, or it may come back).

Stopping sets the runner's stop event and waits, shielded and bounded, for the SDK's
shutdown (close stdin, grace, then kill the server's process tree), then terminates what
is left of the server's process group (children of a server that exited on EOF).

Server names are configuration: they are used for tool names sent to the model but must
reach no frontend wire unhashed (``server_name``/``tool_name`` exist for hashing).

The SDK (and what it brings: anyio, pydantic, starlette, uvicorn, cryptography, ~0.5 s of
imports and ~35 MiB) is imported only when a toolset or lease starts or uses at least
one server (:func:`load_sdk`); importing this module, creating :class:`McpServers`, or
a toolset or lease with no servers, loads none of it. The daemon imports this module
before it reports ready but not the SDK, which is the documented exception to its
preload (``docs/unix-daemon.md``, "Upgrades").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Never, Protocol, Self, TextIO

from magi_code.dataclass import dataclass, field
from magi_code.tools.base import Tool, ToolContext, ToolInputError, ToolOutcome, shielded
from magi_code.tools.environment import child_environment
from magi_code.tools.paths import project_root
from magi_code.tools.processes import (
    child_slot,
    find_child_with_env,
    forget_child,
    group_carries_env,
    record_child,
    terminate_process_group,
    under_umask,
)

if TYPE_CHECKING:
    from mcp import types
    from mcp.client.session import ClientSession, IncomingMessage
    from mcp.client.stdio import StdioServerParameters

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECONDS: Final = 30.0
CALL_TIMEOUT_SECONDS: Final = 120.0
# Re-listing a server's tools after it said they changed (between provider requests).
RELIST_TIMEOUT_SECONDS: Final = 30.0
# The SDK's own shutdown is bounded (stdin close, 2 s, SIGTERM, 2 s, SIGKILL, 2 s).
CLOSE_TIMEOUT_SECONDS: Final = 10.0
# A warm server no turn has used for this long is stopped (``McpServers``).
IDLE_STOP_SECONDS: Final = 300.0
_EXIT_POLL_SECONDS: Final = 1.0
_FIND_PID_SECONDS: Final = 2.0
MAX_TOOLS_PER_SERVER: Final = 128
MAX_LIST_PAGES: Final = 16
MAX_TOOL_NAME_CHARS: Final = 64
MAX_DESCRIPTION_CHARS: Final = 2048
MAX_SCHEMA_BYTES: Final = 64 * 1024
# A random per-server token in the server's environment, to find its pid (see processes).
INSTANCE_VARIABLE: Final = "MC_MCP_INSTANCE"
_UNSAFE_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]")


def _nothing_inherited() -> dict[str, str]:
    return {}


@functools.cache
def load_sdk() -> None:
    """Import the MCP SDK (once) and make its stdio client inherit nothing.

    The SDK puts the env it is given over HOME, LOGNAME, PATH, SHELL, TERM and USER of
    *this* process (in the daemon, the daemon's own environment). A server's environment
    is its client's launch environment only (tests/unit/tools: nothing of the service
    process), so the SDK's default is replaced before any server starts.
    """
    import mcp.client.stdio

    mcp.client.stdio.get_default_environment = _nothing_inherited


class McpServerLike(Protocol):
    """What the toolset needs of a configured server (``config.settings.McpServerDefinition``
    fits as is)."""

    @property
    def name(self) -> str: ...

    @property
    def command(self) -> str: ...

    @property
    def args(self) -> Sequence[str]: ...

    @property
    def env(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """A stdio MCP server: ``command`` with ``args``, its own ``env`` over the child env."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def mcp_tool_name(server_name: str, tool_name: str) -> str:
    """``mcp__<server>__<tool>`` limited to ``[A-Za-z0-9_-]`` and 64 characters.

    A name that does not fit is cut and given a digest suffix of the unsanitized pair,
    so distinct long names stay distinct.
    """
    server = _UNSAFE_NAME_CHARS.sub("_", server_name)
    tool = _UNSAFE_NAME_CHARS.sub("_", tool_name)
    name = f"mcp__{server}__{tool}"
    if len(name) <= MAX_TOOL_NAME_CHARS:
        return name
    return name[: MAX_TOOL_NAME_CHARS - 9] + "_" + _pair_digest(server_name, tool_name)


def _pair_digest(server_name: str, tool_name: str) -> str:
    return hashlib.sha256(f"{server_name}\0{tool_name}".encode()).hexdigest()[:8]


class _ServerConnection:
    """One server's runner task and, while it is up, its initialized session."""

    def __init__(
        self,
        spec: McpServerLike,
        params: StdioServerParameters | None,
        *,
        token: str,
        errlog: TextIO,
        timeout: float,
    ) -> None:
        self.spec = spec
        self._token = token
        self.session: ClientSession | None = None
        self.listed: list[types.Tool] = []
        # Bumped whenever ``listed`` is replaced, so every view of it sees the change.
        self.generation = 0
        # Set by the server's ``notifications/tools/list_changed``.
        self.tools_changed = False
        self.failed = False
        self.exited = False  # the server process ended by itself
        self._params = params
        self._errlog = errlog
        self._startup_timeout = timeout
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pgid: int | None = None
        self._relisting = asyncio.Lock()
        self._closed: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._params is None:
            self.fail()
            return
        self._task = asyncio.create_task(self._serve())

    def fail(self) -> None:
        """Mark a server that cannot be started (no usable project directory)."""
        self.failed = True
        self._ready.set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    @property
    def alive(self) -> bool:
        return self.session is not None

    @property
    def finished(self) -> bool:
        """It failed to start, stopped, or died: a later use needs a new server."""
        if self.failed or self.exited or (self._task is not None and self._task.done()):
            return True
        # Died a moment ago, before the runner noticed (one /proc read).
        return self.session is not None and self._pgid is not None and not _running(self._pgid)

    async def _on_message(self, message: IncomingMessage) -> None:
        # Runs in the SDK's reader: only note the change (listing here would deadlock).
        from mcp import types

        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed = True

    async def _serve(self) -> None:
        try:
            # A server counts in the process's child total for as long as it lives.
            with child_slot(None):
                await self._run_server()
        # Isolation boundary: whatever a server does wrong stays with that server.
        except Exception as exc:  # noqa: BLE001
            self.failed = not self._ready.is_set()
            # Only the type: the name is configuration, the text may be server output.
            logger.warning("an MCP server stopped or failed to start (%s)", type(exc).__name__)
        finally:
            if self._pgid is not None:
                forget_child(self._pgid)
            self.session = None
            self._ready.set()

    async def _run_server(self) -> None:
        import anyio
        from mcp.client.session import ClientSession
        from mcp.client.stdio import stdio_client

        assert self._params is not None
        async with (
            stdio_client(self._params, errlog=self._errlog) as (read, write),
            ClientSession(read, write, message_handler=self._on_message) as session,
        ):
            self._pgid = await _server_pid(self._token)
            if self._pgid is not None:
                record_child(self._pgid, "mcp_server")
            with anyio.fail_after(self._startup_timeout):
                await session.initialize()
                self.tools_changed = False  # the listing below is the current one
                self.listed = await _list_tools(session)
            self.session = session
            self._ready.set()
            await self._until_stopped_or_gone()

    async def _until_stopped_or_gone(self) -> None:
        """Park until told to stop, or until the server process exited (a warm server that
        died is then seen as finished, and the next lease starts a new one)."""
        stop = asyncio.ensure_future(self._stop.wait())
        gone = asyncio.ensure_future(_process_exit(self._pgid))
        try:
            await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            gone.cancel()
        if not self._stop.is_set():
            # Gone: finished from now on, not once the SDK's shutdown below has run.
            self.exited = True
            self.session = None

    async def relist(self) -> None:
        """Re-list the tools if the server said they changed (bounded; a failure keeps the
        previous list). Cancellation leaves the change noted for the next caller."""
        async with self._relisting:
            session = self.session
            if not self.tools_changed or session is None:
                return
            self.tools_changed = False  # a change announced during the listing counts again
            try:
                async with asyncio.timeout(RELIST_TIMEOUT_SECONDS):
                    listed = await _list_tools(session)
            except asyncio.CancelledError:
                self.tools_changed = True
                raise
            except Exception as exc:  # noqa: BLE001 - only this server's tools are affected
                logger.warning(
                    "an MCP server's tools could not be re-listed (%s)", type(exc).__name__
                )
                return
            self.listed = listed
            self.generation += 1

    async def close(self) -> None:
        """Stop the server; idempotent (concurrent callers wait for the same stop)."""
        if self._closed is None:
            self._closed = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closed)

    async def _close(self) -> None:
        self._stop.set()
        task = self._task
        if task is None:
            return
        _, pending = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_SECONDS)
        if pending:
            # Last resort: the SDK's shielded shutdown overran its own bounds.
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_SECONDS)
        if self._pgid is not None and await asyncio.to_thread(
            group_carries_env, self._pgid, INSTANCE_VARIABLE, self._token
        ):
            # The SDK stops the server, but a server that exits on stdin EOF leaves its
            # own children running; the server was started as a group leader.
            await terminate_process_group(self._pgid)


async def _server_pid(token: str) -> int | None:
    """The spawned server's pid, found by its token. Right after ``exec`` a process can
    show an empty environment for a moment, so an early miss is looked at again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _FIND_PID_SECONDS
    while True:
        pid = await asyncio.to_thread(find_child_with_env, INSTANCE_VARIABLE, token)
        if pid is not None or loop.time() >= deadline:
            return pid
        await asyncio.sleep(0.01)


async def _process_exit(pid: int | None) -> None:
    """Return once process ``pid`` has exited (never, when it is not known)."""
    if pid is None:
        await asyncio.Event().wait()
        return
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        # No pidfd (not Linux, or an old kernel): look now and then.
        while await asyncio.to_thread(_running, pid):
            await asyncio.sleep(_EXIT_POLL_SECONDS)
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    try:
        loop.add_reader(fd, exited.set)  # a pidfd becomes readable when its process exits
        try:
            await exited.wait()
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def _running(pid: int) -> bool:
    import psutil  # as in tools.processes: loaded where a process is looked at

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


@dataclass(frozen=True, slots=True)
class _Launch:
    """What every server of one tool context starts with."""

    cwd: Path | None
    env: Mapping[str, str]
    umask: int | None


def _launch_for(ctx: ToolContext) -> _Launch:
    """Blocking (it resolves the project directory)."""
    try:
        cwd: Path | None = project_root(ctx.project_dir)
    except ToolInputError:
        cwd = None
    env = child_environment(ctx.env, secret_names=ctx.secret_names)
    return _Launch(cwd, env, ctx.umask)


def _fingerprint(spec: McpServerLike, launch: _Launch) -> str:
    """Identifies a server by everything it is started with (the key of a warm server)."""
    parts = [
        spec.name,
        spec.command,
        list(spec.args),
        sorted(spec.env.items()),
        str(launch.cwd),
        sorted(launch.env.items()),
        launch.umask,
    ]
    text = json.dumps(parts, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _connection(
    spec: McpServerLike, launch: _Launch, *, errlog: TextIO, startup_timeout: float
) -> _ServerConnection:
    """A server not started yet (``start()``); needs :func:`load_sdk` done."""
    from mcp.client.stdio import StdioServerParameters

    token = secrets.token_hex(16)
    params = None
    if launch.cwd is not None:
        # The SDK spawns through anyio on uvloop, which takes no ``umask=``: the mask is
        # set by the wrapper that ``under_umask`` puts before the command.
        command, *args = under_umask([spec.command, *spec.args], launch.umask)
        params = StdioServerParameters(
            command=command,
            args=args,
            # A server's own configured env is deliberate, so it may set any name.
            env=dict(launch.env) | dict(spec.env) | {INSTANCE_VARIABLE: token},
            cwd=launch.cwd,
        )
    return _ServerConnection(spec, params, token=token, errlog=errlog, timeout=startup_timeout)


async def _wait_started(connections: Iterable[_ServerConnection], startup_timeout: float) -> None:
    waits = [connection.wait_ready() for connection in connections]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(startup_timeout + CLOSE_TIMEOUT_SECONDS):
            await asyncio.gather(*waits)


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    from mcp import types

    tools: list[types.Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if cursor is None or cursor in seen or len(tools) >= MAX_TOOLS_PER_SERVER:
            break
        seen.add(cursor)
    return tools[:MAX_TOOLS_PER_SERVER]


class McpTool:
    """One MCP tool as a ``Tool``; a failure of the call or the server fails only the call."""

    def __init__(
        self,
        connection: _ServerConnection,
        listed: types.Tool,
        *,
        name: str,
        parameters: Mapping[str, object],
        call_timeout: float,
    ) -> None:
        self.name = name
        self.server_name = connection.spec.name
        self.tool_name = listed.name
        description = listed.description or listed.title or f"MCP tool {listed.name}"
        self.description = description[:MAX_DESCRIPTION_CHARS]
        self.parameters = parameters
        # The server says the tool changes nothing (``readOnlyHint``): it needs no approval
        # (turns.approvals). Not ``read_only``: that would also run its calls concurrently.
        annotations = listed.annotations
        self.declared_read_only = bool(annotations is not None and annotations.read_only_hint)
        self._connection = connection
        self._call_timeout = call_timeout

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        from mcp import types
        from mcp.shared.exceptions import MCPError

        session = self._connection.session
        if session is None:
            return ToolOutcome.error("The MCP server for this tool is not running.")
        try:
            # The SDK times the read; the outer bound also covers a stalled write.
            async with asyncio.timeout(self._call_timeout + 5):
                result = await session.call_tool(
                    self.tool_name, dict(arguments), read_timeout_seconds=self._call_timeout
                )
        except TimeoutError:
            return _timed_out()
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                return _timed_out()
            if exc.code == types.CONNECTION_CLOSED:
                return ToolOutcome.error("The MCP server for this tool is not running.")
            return ToolOutcome.error(f"The MCP server returned an error: {exc.message}")
        # A broken server can fail in many SDK-internal ways; each fails only this call.
        except Exception as exc:  # noqa: BLE001
            logger.warning("an MCP tool call failed (%s)", type(exc).__name__)
            return ToolOutcome.error(f"The MCP tool call failed ({type(exc).__name__}).")
        return ToolOutcome(output=result_text(result), is_error=result.is_error, timed_out=False)


def _timed_out() -> ToolOutcome:
    return ToolOutcome.error("The MCP tool call timed out.", timed_out=True)


def result_text(result: types.CallToolResult) -> str:
    """Text parts joined; other content summarized (the model cannot see binary data)."""
    from mcp import types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent):
            parts.append(f"[image content ({block.mime_type}) not shown]")
        elif isinstance(block, types.AudioContent):
            parts.append(f"[audio content ({block.mime_type}) not shown]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block.resource, types.TextResourceContents):
            parts.append(block.resource.text)
        else:
            parts.append(f"[binary resource {block.resource.uri} not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) if parts else "(no output)"


def _schema(listed: types.Tool) -> Mapping[str, object] | None:
    schema = listed.input_schema
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        return None
    return schema


class _ToolsView:
    """The tools of a list of servers, rebuilt when a server's listing changed."""

    def __init__(self, call_timeout: float) -> None:
        self._call_timeout = call_timeout
        self._connections: list[_ServerConnection] = []
        self._tools: list[Tool] = []
        self._failed: tuple[str, ...] = ()
        self._generations: tuple[int, ...] = ()

    def tools(self) -> list[Tool]:
        return list(self._tools)

    @property
    def failed_servers(self) -> tuple[str, ...]:
        """Configured names of servers that could not start; hash before any wire use."""
        return self._failed

    async def refresh(self) -> bool:
        """Re-list the servers that announced a changed tool list; True when the tools
        changed (the agent asks before each provider request)."""
        changed = [c for c in self._connections if c.tools_changed and c.alive]
        if changed:
            await asyncio.gather(*(connection.relist() for connection in changed))
        if tuple(c.generation for c in self._connections) == self._generations:
            return False
        before = [(t.name, t.description, t.parameters) for t in self._tools]
        self._build()
        return before != [(t.name, t.description, t.parameters) for t in self._tools]

    def _build(self) -> None:
        self._generations = tuple(c.generation for c in self._connections)
        self._failed = tuple(c.spec.name for c in self._connections if not c.alive)
        self._tools = _collect_tools(self._connections, self._call_timeout)


def _collect_tools(connections: Iterable[_ServerConnection], call_timeout: float) -> list[Tool]:
    tools: list[Tool] = []
    used: set[str] = set()
    for connection in connections:
        if not connection.alive:
            continue
        for listed in connection.listed:
            parameters = _schema(listed)
            if parameters is None:
                continue
            name = mcp_tool_name(connection.spec.name, listed.name)
            if name in used:
                name = name[: MAX_TOOL_NAME_CHARS - 9] + "_"
                name += _pair_digest(connection.spec.name, listed.name)
            if name in used:
                continue
            used.add(name)
            tools.append(
                McpTool(
                    connection,
                    listed,
                    name=name,
                    parameters=parameters,
                    call_timeout=call_timeout,
                )
            )
    return tools


class McpToolset(_ToolsView):
    """The MCP servers of one use and their tools, started on entry and stopped on exit.

    ``async with McpToolset(servers, ctx) as toolset: toolset.tools()``. Entering never
    fails because of a server: one that cannot start or list its tools within the startup
    timeout is skipped and counted in ``failed_servers``. Closing stops every server.
    """

    def __init__(
        self,
        servers: Iterable[McpServerLike],
        ctx: ToolContext,
        *,
        startup_timeout: float = STARTUP_TIMEOUT_SECONDS,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
        errlog: TextIO | None = None,
    ) -> None:
        super().__init__(call_timeout)
        self._servers = tuple(servers)
        self._ctx = ctx
        self._startup_timeout = startup_timeout
        self._errlog = errlog
        self._own_errlog: TextIO | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start every server and collect their tools; on cancellation, stop them all."""
        try:
            await self._start()
        except BaseException:
            await shielded(self.aclose())
            raise

    async def _start(self) -> None:
        if not self._servers:
            return  # nothing of the SDK is imported for a turn without MCP servers
        # The first import takes ~0.5 s: off the event loop, so other turns keep streaming.
        await asyncio.to_thread(load_sdk)
        launch = await asyncio.to_thread(_launch_for, self._ctx)
        errlog = self._errlog
        if errlog is None:
            # Server stderr is not ours to show: stdio's stderr is for service diagnostics.
            errlog = self._own_errlog = open(os.devnull, "w")  # noqa: SIM115
        for spec in self._servers:
            connection = _connection(
                spec, launch, errlog=errlog, startup_timeout=self._startup_timeout
            )
            self._connections.append(connection)
            connection.start()
        await _wait_started(self._connections, self._startup_timeout)
        self._build()

    async def aclose(self) -> None:
        """Stop every server; idempotent, bounded, and completes even when cancelled."""
        if self._closed:
            return
        self._closed = True
        self._tools = []
        await shielded(self._close_all())

    async def _close_all(self) -> None:
        try:
            await asyncio.gather(*(connection.close() for connection in self._connections))
        finally:
            if self._own_errlog is not None:
                self._own_errlog.close()


class _HasLaunchContext(Protocol):
    """What :class:`McpServers` needs of a coordinator connection."""

    @property
    def ctx(self) -> object: ...


@dataclass(eq=False, slots=True)
class _Warm:
    """A warm server: who may use it again (owners) and who uses it now (leases)."""

    key: str
    connection: _ServerConnection
    owners: dict[int, object] = field(default_factory=dict)
    uses: int = 0
    idle_since: float = 0.0
    # Its last owner detached: it stays until the idle stop, not until its last use.
    lingering: bool = False


class McpServers:
    """The service's warm MCP servers, shared by the turns of every connection.

    A turn uses ``async with servers.lease(owner, definitions, tool_ctx) as lease``
    (``owner``: the turn's launch context, the connection's identity here). It is also a
    domain service for the coordinator (no routes, no events): ``connection_closed``
    stops the servers no other connection uses once no turn uses them, and
    ``connection_detached`` leaves them to the idle stop.

    Concurrency: two turns using one server call it concurrently (one session, requests
    multiplexed by ID; whether a server runs them in parallel is up to the server). A
    lease's cancellation abandons its own calls and never stops a server; only the
    owner rules above, the idle stop, and :meth:`aclose` do.
    """

    def __init__(
        self,
        *,
        idle_seconds: float = IDLE_STOP_SECONDS,
        startup_timeout: float = STARTUP_TIMEOUT_SECONDS,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
        errlog: TextIO | None = None,
    ) -> None:
        self.idle_seconds = idle_seconds
        self.startup_timeout = startup_timeout
        self.call_timeout = call_timeout
        self._errlog = errlog
        self._own_errlog = False
        self._warm: dict[str, _Warm] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None

    # -- as a domain service (no operations, no events) -----------------------------------

    def routes(self) -> Mapping[str, Never]:
        return {}

    async def connection_closed(self, connection: _HasLaunchContext) -> None:
        """Its servers stop unless another connection or a running turn uses them."""
        await self.release_owner(connection.ctx)

    async def connection_detached(self, connection: _HasLaunchContext) -> None:
        """A lost persistent client: its servers stay until the idle stop."""
        await self.release_owner(connection.ctx, linger=True)

    # -- leases ---------------------------------------------------------------------------

    def lease(self, owner: object, servers: Iterable[McpServerLike], ctx: ToolContext) -> McpLease:
        return McpLease(self, owner, tuple(servers), ctx)

    @property
    def running(self) -> int:
        """Warm servers (started or starting)."""
        return len(self._warm)

    async def release_owner(self, owner: object, *, linger: bool = False) -> None:
        """``owner`` will not use its servers again; stop those nobody else holds (now,
        or once their last use ends), or with ``linger``, leave them to the idle stop."""
        stops = []
        for warm in list(self._warm.values()):
            if warm.owners.pop(id(owner), None) is None or warm.owners:
                continue
            if linger:
                warm.lingering = True
            elif warm.uses == 0:
                stops.append(self._stop(warm))
        await shielded(self._settled(stops))

    async def aclose(self) -> None:
        """Stop every server (the service ends); bounded, completes when cancelled."""
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
        stops = [self._stop(warm) for warm in list(self._warm.values())]
        try:
            await shielded(self._settled([*stops, *self._stopping]))
            if reaper is not None:
                await asyncio.wait({reaper})
        finally:
            if self._errlog is not None and self._own_errlog:
                self._errlog.close()
                self._errlog = None

    async def _acquire(
        self, owner: object, servers: Sequence[McpServerLike], ctx: ToolContext
    ) -> list[_Warm]:
        if not servers:
            # No servers now: the owner's earlier ones (settings changed) are released.
            self._drop_other(owner, set())
            return []
        await asyncio.to_thread(load_sdk)  # the first import takes ~0.5 s: off the loop
        launch = await asyncio.to_thread(_launch_for, ctx)
        errlog = self._errlog
        if errlog is None:
            # Server stderr is not ours to show: stdio's stderr is for service diagnostics.
            errlog = self._errlog = open(os.devnull, "w")  # noqa: SIM115 - closed in aclose
            self._own_errlog = True
        acquired: list[_Warm] = []
        for spec in servers:
            key = _fingerprint(spec, launch)
            warm = self._warm.get(key)
            if warm is not None and warm.connection.finished:
                self._stop(warm)  # it died or never started: this use starts it again
                warm = None
            if warm is None:
                connection = _connection(
                    spec, launch, errlog=errlog, startup_timeout=self.startup_timeout
                )
                connection.start()
                warm = _Warm(key, connection)
                if launch.cwd is not None:
                    self._warm[key] = warm
            warm.owners[id(owner)] = owner
            warm.lingering = False
            warm.uses += 1
            acquired.append(warm)
        self._drop_other(owner, {warm.key for warm in acquired})
        self._ensure_reaper()
        try:
            # A start another lease began is waited for, not repeated; cancelling this
            # wait leaves the start running for the others (and for the next turn).
            await _wait_started([w.connection for w in acquired], self.startup_timeout)
        except BaseException:
            self._release(acquired)
            raise
        return acquired

    def _drop_other(self, owner: object, keep: set[str]) -> None:
        """The owner's servers not in ``keep`` were replaced (its settings changed)."""
        for warm in list(self._warm.values()):
            if warm.key in keep or id(owner) not in warm.owners:
                continue
            del warm.owners[id(owner)]
            if not warm.owners and warm.uses == 0:
                self._stop(warm)

    def _release(self, acquired: Iterable[_Warm]) -> None:
        now = asyncio.get_running_loop().time()
        for warm in acquired:
            warm.uses -= 1
            warm.idle_since = now
            if warm.uses == 0 and not warm.owners and not warm.lingering:
                self._stop(warm)  # its connections closed while a turn still used it
            elif warm.uses == 0 and self._warm.get(warm.key) is not warm:
                self._stop(warm)  # replaced after it died

    def _stop(self, warm: _Warm) -> asyncio.Task[None]:
        if self._warm.get(warm.key) is warm:
            del self._warm[warm.key]
        task = asyncio.ensure_future(warm.connection.close())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return task

    async def _settled(self, stops: Iterable[asyncio.Future[None]]) -> None:
        pending = list(stops)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())

    async def _reap(self) -> None:
        """Stop servers no turn has used for the idle period; ends when none is left.

        It runs whenever a server is warm, so when the event loop ends (the process
        exits and cancels what is left) its cancellation stops every server that is
        still warm, with what the server started, as ``aclose`` would.
        """
        loop = asyncio.get_running_loop()
        tick = max(0.05, min(30.0, self.idle_seconds / 4))
        try:
            while self._warm:
                await asyncio.sleep(tick)
                now = loop.time()
                for warm in list(self._warm.values()):
                    if warm.uses == 0 and now - warm.idle_since >= self.idle_seconds:
                        self._stop(warm)
        except asyncio.CancelledError:
            stops = [self._stop(warm) for warm in list(self._warm.values())]
            await shielded(self._settled(stops))
            raise


class McpLease(_ToolsView):
    """One turn's use of warm servers (``McpServers.lease``): their tools while it lasts.

    Entering starts the servers that are not running (or waits for a start in progress)
    and never fails because of a server; leaving only ends this use.
    """

    def __init__(
        self,
        servers: McpServers,
        owner: object,
        definitions: Sequence[McpServerLike],
        ctx: ToolContext,
    ) -> None:
        super().__init__(servers.call_timeout)
        self._servers = servers
        self._owner = owner
        self._definitions = definitions
        self._ctx = ctx
        self._acquired: list[_Warm] | None = None

    async def __aenter__(self) -> Self:
        self._acquired = await self._servers._acquire(self._owner, self._definitions, self._ctx)
        self._connections = [warm.connection for warm in self._acquired]
        changed = [c for c in self._connections if c.tools_changed and c.alive]
        try:
            # Changed while warm (between turns): this turn starts with the current list.
            await asyncio.gather(*(connection.relist() for connection in changed))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        self._build()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        acquired, self._acquired = self._acquired, None
        self._tools = []
        if acquired:
            self._servers._release(acquired)
