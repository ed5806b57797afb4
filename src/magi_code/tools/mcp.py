"""MCP servers over stdio, exposed as tools, through the official ``mcp`` SDK (2.x).

Theory of operation: each configured server gets one runner task that owns the SDK's
``stdio_client`` and ``ClientSession`` contexts (anyio cancel scopes must be entered and
left by the same task). The runner starts the server in the project directory with the
stripped child environment plus the server's own ``env``, under the client's umask,
initializes, lists its tools (following pagination, bounded), then parks until the
toolset closes. Tool calls use the session from the calling task. Because nothing of a
server lives in the caller's task, a server that fails to start, hangs, or dies affects
only its own tools, and a toolset may be kept warm across turns and closed from any task.

Closing sets each runner's stop event and waits, shielded and bounded, for the SDK's
shutdown (close stdin, grace, then kill the server's process tree), then terminates what
is left of the server's process group (children of a server that exited on EOF).

Server names are configuration: they are used for tool names sent to the model but must
reach no frontend wire unhashed (``server_name``/``tool_name`` exist for hashing).

The SDK (and what it brings: anyio, pydantic, starlette, uvicorn, cryptography, ~0.5 s of
imports and ~35 MiB) is imported only when a toolset starts at least one server
(:func:`load_sdk`); importing this module, or a toolset with no servers, loads none of it.
The daemon imports this module before it reports ready but not the SDK, which is the
documented exception to its preload (``docs/unix-daemon.md``, "Upgrades").
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
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Protocol, Self, TextIO

from magi_code.tools.base import Tool, ToolContext, ToolInputError, ToolOutcome, shielded
from magi_code.tools.environment import child_environment
from magi_code.tools.paths import project_root
from magi_code.tools.processes import (
    find_child_with_env,
    group_carries_env,
    terminate_process_group,
    under_umask,
)

if TYPE_CHECKING:
    from mcp import types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECONDS: Final = 30.0
CALL_TIMEOUT_SECONDS: Final = 120.0
# The SDK's own shutdown is bounded (stdin close, 2 s, SIGTERM, 2 s, SIGKILL, 2 s).
CLOSE_TIMEOUT_SECONDS: Final = 10.0
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
        params: StdioServerParameters,
        *,
        token: str,
        errlog: TextIO,
        timeout: float,
    ) -> None:
        self.spec = spec
        self._token = token
        self.session: ClientSession | None = None
        self.listed: list[types.Tool] = []
        self.failed = False
        self._params = params
        self._errlog = errlog
        self._startup_timeout = timeout
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pgid: int | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve())

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def _serve(self) -> None:
        import anyio
        from mcp.client.session import ClientSession
        from mcp.client.stdio import stdio_client

        try:
            async with (
                stdio_client(self._params, errlog=self._errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                self._pgid = await asyncio.to_thread(
                    find_child_with_env, INSTANCE_VARIABLE, self._token
                )
                with anyio.fail_after(self._startup_timeout):
                    await session.initialize()
                    self.listed = await _list_tools(session)
                self.session = session
                self._ready.set()
                await self._stop.wait()
        # Isolation boundary: whatever a server does wrong stays with that server.
        except Exception as exc:  # noqa: BLE001
            self.failed = not self._ready.is_set()
            # Only the type: the name is configuration, the text may be server output.
            logger.warning("an MCP server stopped or failed to start (%s)", type(exc).__name__)
        finally:
            self.session = None
            self._ready.set()

    async def close(self) -> None:
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


class McpToolset:
    """The MCP servers of one turn (or kept warm across turns) and their tools.

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
        self._servers = tuple(servers)
        self._ctx = ctx
        self._startup_timeout = startup_timeout
        self._call_timeout = call_timeout
        self._errlog = errlog
        self._own_errlog: TextIO | None = None
        self._connections: list[_ServerConnection] = []
        self._tools: list[Tool] = []
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
        from mcp.client.stdio import StdioServerParameters

        try:
            cwd: Path | None = await asyncio.to_thread(project_root, self._ctx.project_dir)
        except ToolInputError:
            cwd = None
        base_env = child_environment(self._ctx.env, secret_names=self._ctx.secret_names)
        errlog = self._errlog
        if errlog is None:
            # Server stderr is not ours to show: stdio's stderr is for service diagnostics.
            errlog = self._own_errlog = open(os.devnull, "w")  # noqa: SIM115
        for spec in self._servers:
            token = secrets.token_hex(16)
            # The SDK spawns through anyio on uvloop, which takes no ``umask=``: the mask is
            # set by the wrapper that ``under_umask`` puts before the command.
            command, *args = under_umask([spec.command, *spec.args], self._ctx.umask)
            params = StdioServerParameters(
                command=command,
                args=args,
                # A server's own configured env is deliberate, so it may set any name.
                env=base_env | dict(spec.env) | {INSTANCE_VARIABLE: token},
                cwd=cwd,
            )
            connection = _ServerConnection(
                spec, params, token=token, errlog=errlog, timeout=self._startup_timeout
            )
            self._connections.append(connection)
            if cwd is None:
                connection.failed = True
                continue
            connection.start()
        waits = [connection.wait_ready() for connection in self._connections]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._startup_timeout + CLOSE_TIMEOUT_SECONDS):
                await asyncio.gather(*waits)
        self._tools = self._collect_tools()

    def _collect_tools(self) -> list[Tool]:
        tools: list[Tool] = []
        used: set[str] = set()
        for connection in self._connections:
            if connection.session is None:
                connection.failed = True
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
                        call_timeout=self._call_timeout,
                    )
                )
        return tools

    def tools(self) -> list[Tool]:
        return list(self._tools)

    @property
    def failed_servers(self) -> tuple[str, ...]:
        """Configured names of servers that could not start; hash before any wire use."""
        return tuple(c.spec.name for c in self._connections if c.failed)

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
