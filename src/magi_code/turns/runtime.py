"""The normal agent runtime a started turn runs: settings reload, credentials, startup
instructions, built-in + MCP tools, subagents, compaction, then the agent loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from magi_code.auth.credentials import resolve_headers
from magi_code.auth.store import AuthStore
from magi_code.config.effective import Effective, resolve_effective
from magi_code.config.schema import SANDBOX_LEVELS
from magi_code.config.settings import Layer, Settings, load_settings, project_settings_path
from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.providers.apis import API_PROFILES
from magi_code.providers.http import HttpClients, transport_options
from magi_code.providers.stream import stream_settings
from magi_code.providers.types import Endpoint, ReasoningLevel
from magi_code.sessions.checkpoints import Checkpoints
from magi_code.sessions.store import SessionContext
from magi_code.storage.files import locked
from magi_code.storage.launch import LaunchContext
from magi_code.tools.base import Tool, ToolContext
from magi_code.tools.builtin import BUILTIN_TOOL_NAMES, BUILTIN_TOOLS
from magi_code.tools.frontend import Frontend
from magi_code.tools.sandbox import Sandbox, bubblewrap, service_directories
from magi_code.turns.failures import PROVIDER_NOT_CONFIGURED, SANDBOX_UNAVAILABLE

from .agent import AgentEnv, AgentPlan, TurnSink
from .approvals import ApprovalGate, Approver, NoApprover
from .checkpoints import TurnCheckpoints, checkpointed
from .context import items_from_records
from .hooks import TurnHooks
from .instructions import system_prompt
from .refreshing import RefreshingAgent
from .skills import SKILL_TOOL_NAME, SkillCache, turn_tools
from .subagent import TASK_TOOL_NAME, TaskTool

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from magi_code.tools.mcp import McpServerLike, McpServers

DEFAULT_MAX_OUTPUT_TOKENS: Final = 8192
ALLOWLISTED_TOOL_NAMES: Final = BUILTIN_TOOL_NAMES | {TASK_TOOL_NAME, SKILL_TOOL_NAME}

# Third-party modules that a turn's first provider request imports (the product imports
# ``httpx`` only where it makes a request, and ``httpx`` loads its transports, ``anyio``'s
# asyncio backend and ``certifi`` only then): warmed by the daemon right after it is
# ready, so it does not wait for them to answer; an embedded service's first turn imports
# them. The MCP SDK is deliberately not among them (``tools.mcp`` imports it only for
# configured servers).
TURN_MODULES: Final = (
    "httpx",
    "certifi",
    "h11",
    "httpcore",
    "httpcore._backends.anyio",
    "anyio",
    "anyio._backends._asyncio",
    "anyio.streams.tls",
)


def warm_turn_modules() -> None:
    """Import :data:`TURN_MODULES`, best effort: a module that a dependency's version
    does not have is skipped (the first turn then imports what it needs itself)."""
    for name in TURN_MODULES:
        with contextlib.suppress(ImportError):
            __import__(name)  # not importlib: ``-X importtime`` shows these
    with contextlib.suppress(ImportError, OSError):
        import certifi

        certifi.where()  # resolves (and caches) the bundle's path via importlib.resources


class TurnSetupError(Exception):
    """The turn cannot reach a provider (no selection, no credentials); fixed label."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.label = label


@dataclass(frozen=True, slots=True)
class PreparedSettings:
    """The settings a turn runs with, read once; the turn keeps them."""

    settings: Settings
    effective: Effective


# Settings that could not be read: the turn is still accepted and fails in its worker.
Prepared = PreparedSettings | ServiceError

# How long a capture waits for another process's settings write before reporting busy.
SETTINGS_LOCK_WAIT: Final = 2.0


def read_settings(ctx: LaunchContext, session: Layer | None = None) -> Prepared:
    """Selection, reasoning and fast settings as the files say now, with the session's
    own selection and reasoning (``session``) over them. Blocking.

    What a v1 turn's worker reloads before provider execution: each file is replaced
    atomically, so it reads the old or the new one and never waits for a write.
    """
    try:
        settings = load_settings(ctx)
        return PreparedSettings(settings, resolve_effective(ctx, settings, session=session))
    except ServiceError as exc:
        return exc


def prepare_settings(ctx: LaunchContext, session: Layer | None = None) -> Prepared:
    """Capture :func:`read_settings` under the settings files' locks (a persistent
    client's turn admission). Blocking (run it in a thread).

    A write holding a lock past ``SETTINGS_LOCK_WAIT`` raises ``configuration_busy``; the
    project lock is only taken when the project has a usable settings directory (capture
    never creates files in the user's project).
    """
    project = project_settings_path(ctx)
    with contextlib.ExitStack() as stack:
        for path in (ctx.global_settings_path, project):
            if path is not None and path.parent.is_dir():
                try:
                    stack.enter_context(locked(path, timeout=SETTINGS_LOCK_WAIT))
                except TimeoutError:  # filelock.Timeout, not imported (see storage.files.locked)
                    raise ServiceError(ErrorCode.CONFIGURATION_BUSY) from None
        return read_settings(ctx, session)


@dataclass(frozen=True, slots=True)
class TurnRequest:
    ctx: LaunchContext
    session_id: str
    turn_id: str
    prompt: str
    history: SessionContext
    # The session's own MCP servers (a client's, RFC-0002 §6.13), beside the configured.
    mcp_servers: tuple[McpServerLike, ...] = ()
    # The session's own selection and reasoning (RFC-0002 §6.15), over the settings'.
    selection: Layer | None = None


class TurnRuntime:
    """Shared per service: the HTTP client cache and the warm MCP servers; everything else
    is read per turn."""

    def __init__(self, clients: HttpClients | None = None, mcp: McpServers | None = None) -> None:
        # Clients per endpoint, credential and the frontend's proxy/CA settings.
        self.clients = clients or HttpClients()
        # Warm MCP servers reused across turns; without them each turn starts its own.
        self.mcp = mcp
        # Skills per launch context, discovered on its first turn (startup resources).
        self.skills = SkillCache()

    @property
    def client(self) -> HttpClients:
        """The client cache (``aclose()`` closes every cached client)."""
        return self.clients

    async def run(
        self,
        turn: TurnRequest,
        prepared: Prepared,
        sink: TurnSink,
        expose_settle: Callable[[Callable[[], Awaitable[None]]], None],
        approver: Approver | None = None,
        frontend: Frontend | None = None,
        steers: Callable[[], Awaitable[Sequence[str]]] | None = None,
    ) -> None:
        """Run the agent with ``prepared`` (captured at admission, or reloaded by the
        worker right before this); the turn keeps them for its whole run. ``approver`` is
        the turn's way to a person; without one, calls that need an answer are refused.
        ``frontend`` is the tool details and editor file access its client asked for;
        ``steers`` hands the main agent the controller's steer texts (``turns.agent``)."""
        ctx = turn.ctx
        if isinstance(prepared, ServiceError):
            raise prepared
        settings, effective = prepared.settings, prepared.effective
        provider = effective.provider
        if provider is None:
            raise TurnSetupError(PROVIDER_NOT_CONFIGURED)
        store = AuthStore(ctx.auth_path)
        # The launch context's proxy/CA environment and the captured ``network`` settings.
        http = self.clients.bound(transport_options(ctx.env, settings.network))
        headers = await resolve_headers(ctx, provider, store, http)
        skills = await self.skills.catalog(ctx)
        plan = AgentPlan(
            endpoint=Endpoint(provider.api, provider.base_url, headers),
            model=effective.model_id,
            reasoning=_reasoning(effective.thinking_level),
            fast=effective.fast,
            max_output_tokens=effective.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS,
            context_window=effective.context_window or API_PROFILES[provider.api].context_window,
            system=await asyncio.to_thread(system_prompt, ctx.project_dir, skills),
            cache_key=turn.session_id,
            stream=stream_settings(ctx.env),
        )
        tool_ctx = ToolContext(
            project_dir=ctx.project_dir,
            env=ctx.env,
            secret_names=_secret_names(settings),
            umask=ctx.tool_umask,
            sandbox=await asyncio.to_thread(turn_sandbox, ctx, settings),
            details=frontend.details if frontend is not None else None,
            editor=frontend.editor if frontend is not None else None,
        )
        blobs = Checkpoints(ctx.sessions_dir / turn.session_id)
        # The agent compacts it first when it needs to (turns/agent.py).
        history = items_from_records(turn.history.records)
        # The toolset imports the MCP SDK only when the settings configure a server.
        from magi_code.tools.mcp import McpToolset

        servers = joined_mcp_servers(settings.mcp_servers, turn.mcp_servers)
        # The launch context is the owner: its connection's end stops what it alone used.
        toolset = (
            McpToolset(servers, tool_ctx)
            if self.mcp is None
            else self.mcp.lease(ctx, servers, tool_ctx)
        )
        async with http.lease(provider.base_url, headers) as client, toolset:
            env = AgentEnv(client, plan, tool_ctx, sink, turn.turn_id, ALLOWLISTED_TOOL_NAMES)
            hooks = TurnHooks.for_turn(
                settings, tool_ctx, sink, turn_id=turn.turn_id, session_id=turn.session_id
            )
            # Inside the hooks: a blocking pre_tool_use hook decides before anyone is asked.
            gate = ApprovalGate(
                settings.approvals, approver or NoApprover(), ctx, sink, turn.turn_id
            )
            # Innermost: only a call that really runs changes files.
            files = checkpointed(BUILTIN_TOOLS, TurnCheckpoints(blobs, sink, turn.turn_id))
            builtins = hooks.wrap(gate.wrap(turn_tools(skills, files, sink.activity, turn.turn_id)))
            task = TaskTool(env, builtins)

            def tools() -> list[Tool]:
                # Built again when an MCP server's tool list changed (list_changed).
                return [*builtins, *hooks.wrap(gate.wrap([task, *toolset.tools()]))]

            agent = RefreshingAgent(
                env,
                tools,
                toolset,
                reauthorize=(
                    (lambda: resolve_headers(ctx, provider, store, http, force_refresh=True))
                    if provider.credential == "oauth"
                    else None
                ),
                steers=steers,
            )
            expose_settle(agent.settle_text)
            await hooks.user_prompt_submit(turn.prompt)
            final_text = await agent.run(history, turn.prompt, session=turn.history)
            await hooks.stop(final_text)


def joined_mcp_servers(
    configured: Mapping[str, McpServerLike], own: Iterable[McpServerLike]
) -> list[McpServerLike]:
    """The configured MCP servers and the session's own; on a name clash the configured
    server is used and the session's is left out (a client never replaces what the user's
    settings say a name is)."""
    servers = list(configured.values())
    clashes = 0
    for server in own:
        if server.name in configured:
            clashes += 1
        else:
            servers.append(server)
    if clashes:
        log.warning("%d of the session's MCP servers have a configured server's name", clashes)
    return servers


def turn_sandbox(ctx: LaunchContext, settings: Settings) -> Sandbox | None:
    """Where the turn's shell and hook commands run: ``None`` (unconfined) for ``sandbox:
    none``; for ``workspace_write`` the sandbox hiding this home's and this process's
    service directories. Blocking (the first call probes ``bwrap``).

    Raises:
        TurnSetupError: ``sandbox_unavailable``: asked for, and it cannot start here.
    """
    if settings.sandbox == SANDBOX_LEVELS[0]:
        return None
    bwrap = bubblewrap()
    if bwrap.path is None:
        raise TurnSetupError(SANDBOX_UNAVAILABLE)
    hidden = service_directories(str(ctx.mc_home), (ctx.env, os.environ))
    return Sandbox(bwrap.path, network=settings.sandbox_network, hidden=hidden)


def _reasoning(level: str) -> ReasoningLevel:
    for known in ("default", "low", "medium", "high", "x_high", "max"):
        if level == known:
            return known
    return "default"


def _secret_names(settings: Settings) -> frozenset[str]:
    return frozenset(p.api_key_env for p in settings.providers.values() if p.api_key_env)
