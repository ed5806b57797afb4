"""The ACP methods (stable schema v1), each translated to v1 requests on the core.

``session/new`` creates a v1 session (and releases its writer lease at once, so a v1
frontend can run a turn on it between prompts), giving it the editor's stdio MCP servers
(RFC-0002 §6.13); ``session/prompt`` is one ``turn.start`` whose events stream back as
``session/update`` notifications; ``session/load`` streams the session's transcript back,
tool calls included (§6.14); ``session/cancel`` is ``turn.cancel``. The config options
(model, reasoning level) are the session's own selection in the core (§6.15). ACP
session IDs are the v1 session IDs, so every frontend sees the same sessions.
``authenticate`` with ``codex-login`` is the core's ``auth.login.start``, with the browser
opened here (the adapter runs on the user's machine; the core never opens one).

Approvals: every core connection answers approval requests. A request of the running
prompt's turn reaches ``Agent.prompt``'s event loop (through the same queue as the turn's
events, so it is never ahead of the turn's start) and becomes a
``session/request_permission`` to the editor; the editor's choice goes back with
``answer_approval`` (:data:`PERMISSION_OPTIONS` maps ACP's option kinds to the core's
answers). Session modes are the approval policies (``ask``, ``auto``, ``read_only``): a
mode is the session's own policy in the core (``set_session_policy``), never looser than
an untrusted project asks. ``docs/acp.md`` has both for editor authors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Final

from magi_code.auth.browser import open_browser_apart
from magi_code.client import (
    ApprovalRequest,
    ApprovalResolved,
    Client,
    DaemonError,
    DaemonUnavailable,
    ErrorInfo,
    FileRequest,
    Overloaded,
    SessionError,
    ToolDetail,
)
from magi_code.dataclass import dataclass, field
from magi_code.storage.launch import LaunchContext
from magi_code.version import package_version

from . import rpc, updates
from .backend import MODE_ENV, Backend, CoreUnavailable
from .rpc import RpcError, invalid_params

log = logging.getLogger(__name__)

PROTOCOL_VERSION: Final = 1
# ACP's code for a session (or other resource) that does not exist.
RESOURCE_NOT_FOUND: Final = -32002
MCP_SERVERS_REFUSED: Final = (
    "mcpServers: at most 16 stdio servers, 64 KiB in all, each with a command and "
    "environment variable names of letters, digits and _"
)
_UNSAFE_SERVER_NAME: Final = re.compile(r"[^A-Za-z0-9_.-]")
# The largest file text the editor may hand the core (RFC-0002 §6.8: one frame holds it).
MAX_EDITOR_TEXT_BYTES: Final = 768 * 1024

AUTH_METHODS: Final = [
    {
        "id": "api-key",
        "name": "API key",
        "description": "A provider key in the environment (e.g. ANTHROPIC_API_KEY) or stored "
        "with `magi-code login --provider anthropic`.",
    },
    {
        "id": "codex-login",
        "name": "ChatGPT account (Codex)",
        "description": "Sign in to ChatGPT in a browser. If none can be opened, the answer "
        "gives the address to open; authenticate again once signed in.",
    },
]


# Session modes: the approval policies (docs/safety.md), the session's own in the core.
MODES: Final = [
    {
        "id": "ask",
        "name": "Ask",
        "description": "Ask before commands, file changes and MCP tools that may write",
    },
    {"id": "auto", "name": "Auto", "description": "Run every tool call without asking"},
    {
        "id": "read_only",
        "name": "Read-only",
        "description": "Refuse commands, file changes and MCP tools that may write",
    },
]
# ACP permission options (optionId = kind) and the core's answer to each; allow_always is
# "for this project" where the core offers it (a trusted project), else "for this session".
PERMISSION_OPTIONS: Final = {
    "allow_once": ("Allow once", ("allow_once",)),
    "allow_always": ("Always allow", ("allow_project", "allow_session")),
    "reject_once": ("Reject", ("reject",)),
    "reject_always": ("Always reject in this session", ("reject",)),
}
# Config options: the most models offered, and the reasoning levels' names.
MAX_MODEL_OPTIONS: Final = 128
THOUGHT_LEVELS: Final = {
    "default": "Default",
    "low": "Low",
    "medium": "Medium",
    "high": "High",
    "x_high": "Extra high",
    "max": "Max",
}
PERMISSION_KINDS: Final = {"command": "execute", "file_change": "edit", "mcp_tool": "other"}
Queued = dict[str, Any] | ToolDetail | ApprovalRequest | None


@dataclass(slots=True)
class Session:
    session_id: str
    cwd: Path
    client: Client
    # The editor's MCP servers (RFC-0002 §6.13 shape), given again to a new core.
    mcp_servers: list[dict[str, Any]]
    # The config options chosen (provider, model, level; None: the settings'), given
    # again to a new core, and what the session's turns get (RFC-0002 §6.15).
    chosen: tuple[str, str, str] | None = None
    selected: dict[str, Any] = field(default_factory=dict)
    # The running prompt's events, tool details and approval requests (the pump puts them
    # here).
    queue: asyncio.Queue[Queued] | None = None
    turn_id: str | None = None
    cancel_requested: bool = False
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)  # approval IDs put to the editor
    # What the editor answered "always reject" for: rejected without asking again.
    rejected: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Login:
    """The Codex login this adapter started (``auth.login.start``), followed by its events."""

    client: Client
    request_id: str
    url: asyncio.Future[str]
    outcome: asyncio.Future[str]  # the terminal state


class Agent:
    def __init__(self, ctx: LaunchContext, mode: str) -> None:
        self.backend = Backend(ctx, mode, self._on_event)
        self.sessions: dict[str, Session] = {}
        self.client_capabilities: dict[str, Any] = {}
        self.peer: rpc.Peer | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # file requests being answered
        self.login: Login | None = None
        self._logins = 0
        self.requests: dict[str, rpc.Handler] = {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/list": self.list_sessions,
            "session/prompt": self.prompt,
            "session/set_mode": self.set_mode,
            "session/set_config_option": self.set_config_option,
        }
        self.notifications: dict[str, rpc.Handler] = {"session/cancel": self.cancel}

    # -- connection ----------------------------------------------------------------------

    async def initialize(self, method: str, params: Any) -> dict[str, Any]:
        params = _object(params)
        if not _is_int(params.get("protocolVersion")):
            raise invalid_params("protocolVersion must be an integer")
        capabilities = params.get("clientCapabilities")
        if isinstance(capabilities, dict):
            self.client_capabilities = capabilities
        fs = self.client_capabilities.get("fs")
        fs = fs if isinstance(fs, dict) else {}
        offered = [("read", "readTextFile"), ("write", "writeTextFile")]
        # The core's connections made from now on: tool details, and this editor's files.
        self.backend.options = {
            "tool_details": True,
            "editor_files": [op for op, name in offered if fs.get(name) is True],
        }
        return {
            # Only v1 exists; a client that asked for another decides whether to go on.
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"list": {}},
            },
            "authMethods": AUTH_METHODS,
            "agentInfo": {"name": "magi-code", "title": "magi-code", "version": package_version()},
        }

    async def authenticate(self, method: str, params: Any) -> dict[str, Any]:
        method_id = _object(params).get("methodId")
        if method_id not in ("api-key", "codex-login"):
            raise invalid_params("unknown methodId")
        client = await self._client(self.backend.ctx.project_dir)
        status = await _call(client, "auth.status", {})
        wanted = {"api-key": ("api_key", "none"), "codex-login": ("oauth",)}[method_id]
        providers = status["providers"]
        if any(p["ready"] and p["auth_method"] in wanted for p in providers):
            return {}
        if method_id == "codex-login":
            return await self._codex_login(client)
        raise RpcError(
            rpc.AUTH_REQUIRED,
            "Authentication required: set the provider's key variable, "
            "or run `magi-code login --provider anthropic`",
        )

    async def _codex_login(self, client: Client) -> dict[str, Any]:
        """Start the core's loopback login (or join the one running) and open a browser.

        With a browser open, the answer waits for the login's end (the core ends it after
        its callback window); without one, it is at once an error giving the address, and
        a later ``authenticate`` waits for the login that goes on meanwhile.
        """
        login = self.login
        if login is None or login.client is not client:
            login = await self._start_login(client)
            done, _ = await asyncio.wait(
                [login.url, login.outcome], return_when=asyncio.FIRST_COMPLETED
            )
            if login.url in done and not await open_browser_apart(login.url.result()):
                url = login.url.result()
                raise RpcError(
                    rpc.AUTH_REQUIRED,
                    f"Open this address in a browser to sign in to ChatGPT, then "
                    f"authenticate again: {url}",
                    {"url": url},
                )
        state = await asyncio.shield(login.outcome)
        if state == "exchange_succeeded":
            return {}
        raise RpcError(
            rpc.AUTH_REQUIRED,
            f"The ChatGPT login did not complete ({state}); authenticate again",
            {"state": state},
        )

    async def _start_login(self, client: Client) -> Login:
        loop = asyncio.get_running_loop()
        self._logins += 1
        # Known before the request is sent: its events may reach the pump before its reply.
        login = Login(
            client, f"acp-login-{self._logins}", loop.create_future(), loop.create_future()
        )
        self.login = login
        try:
            reply = await client.request(
                "auth.login.start", {"provider_id": "openai-codex"}, request_id=login.request_id
            )
        except (DaemonUnavailable, DaemonError) as exc:
            self.login = None
            raise RpcError(
                rpc.INTERNAL_ERROR,
                "The connection to the service ended",
                {"code": getattr(exc, "code", None)},
            ) from None
        error = reply["error"]
        if error is not None:
            self.login = None
            if error["code"] == "auth_busy":
                raise RpcError(
                    rpc.AUTH_REQUIRED,
                    "Another magi-code login is in progress; finish it, then authenticate again",
                    {"code": "auth_busy"},
                )
            raise _v1_error(error)
        return login

    def _login_event(self, client: Client, event: Any) -> bool:
        """Feed this adapter's login from its events (or its connection's end)."""
        login = self.login
        if login is None or login.client is not client:
            return False
        if event is None:
            state = "connection_ended"
        elif event["request_id"] != login.request_id:
            return False
        elif event["event"] == "auth.login.progress":
            if event["payload"]["state"] == "authorization_url" and not login.url.done():
                login.url.set_result(event["payload"]["url"])
            return True
        else:
            state = event["payload"]["state"]
        if not login.outcome.done():
            login.outcome.set_result(state)
        self.login = None
        return event is not None

    # -- sessions ------------------------------------------------------------------------

    async def new_session(self, method: str, params: Any) -> dict[str, Any]:
        params = _object(params)
        cwd = _cwd(params.get("cwd"))
        servers = _mcp_servers(params)
        client = await self._client(cwd)
        created = await _call(client, "session.create", {}, mcp_servers=servers)
        session_id: str = created["session_id"]
        # Held only while a turn runs (turn.start attaches), so other frontends can too.
        await client.request("session.close", {}, session_id=session_id)
        session = self.sessions[session_id] = Session(session_id, cwd, client, servers)
        return {
            "sessionId": session_id,
            "modes": await _modes(client, session_id),
            "configOptions": await self._choose(session, None),
        }

    async def load_session(self, method: str, params: Any) -> dict[str, Any]:
        params = _object(params)
        session_id = _session_id(params)
        cwd = _cwd(params.get("cwd"))
        servers = _mcp_servers(params)
        client = await self._client(cwd)
        await _give_mcp_servers(client, session_id, servers, busy_ok=not servers)
        cursor: str | None = None
        while True:
            try:
                page = await client.transcript(session_id, cursor)
            except SessionError as exc:
                error = RpcError(
                    rpc.INTERNAL_ERROR, "The session cannot be read", {"code": exc.code}
                )
                raise _not_found(error, session_id) from None
            except (DaemonUnavailable, DaemonError) as exc:
                raise RpcError(
                    rpc.INTERNAL_ERROR,
                    "The connection to the service ended",
                    {"code": getattr(exc, "code", None)},
                ) from None
            for item in page["items"]:
                for update in updates.replay_updates(item, cwd):
                    self._update(session_id, update)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        session = self.sessions[session_id] = Session(session_id, cwd, client, servers)
        return {
            "modes": await _modes(client, session_id),
            "configOptions": await self._choose(session, None),
        }

    async def set_mode(self, method: str, params: Any) -> dict[str, Any]:
        params = _object(params)
        session = self._session(_session_id(params))
        mode = params.get("modeId")
        if mode not in [m["id"] for m in MODES]:
            raise invalid_params("modeId must be ask, auto or read_only")
        effective = await _set_policy(await self._client(session.cwd), session.session_id, mode)
        if effective != mode:  # an untrusted project asks for more: the editor shows it
            self._update(
                session.session_id,
                {"sessionUpdate": "current_mode_update", "currentModeId": effective},
            )
        return {}

    async def set_config_option(self, method: str, params: Any) -> dict[str, Any]:
        """``model`` or ``thought_level``: the session's own selection in the core, for its
        next turns (a new model keeps the reasoning level when it has it)."""
        params = _object(params)
        session = self._session(_session_id(params))
        config_id, value = params.get("configId"), params.get("value")
        if config_id not in ("model", "thought_level") or not isinstance(value, str):
            raise invalid_params("configId must be model or thought_level, value a string")
        now = session.selected
        model = value if config_id == "model" else now["model_id"]
        level = value if config_id == "thought_level" else now["thinking_level"]
        options = await self._choose(session, (now["provider_id"], model, level))
        return {"configOptions": options}

    async def _choose(
        self, session: Session, chosen: tuple[str, str, str] | None
    ) -> list[dict[str, Any]]:
        """Make ``chosen`` the session's selection in the core (None: the settings'); its
        config options then."""
        client = await self._client(session.cwd)
        session.selected = await _selection(client, session.session_id, chosen)
        session.chosen = chosen
        return await _config_options(client, session.selected)

    async def list_sessions(self, method: str, params: Any) -> dict[str, Any]:
        params = _object(params)
        cwd = _cwd(params["cwd"]) if params.get("cwd") is not None else self.backend.ctx.project_dir
        cursor = params.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise invalid_params("cursor must be a string")
        client = await self._client(cwd)
        try:
            page = await _call(client, "session.list", {"after": cursor} if cursor else {})
        except RpcError as error:
            if error.data == {"code": "invalid_session_id"}:
                raise invalid_params("cursor is not one this agent gave") from None
            raise
        # Sessions belong to MC_HOME, not to a directory: each is shown under the cwd asked.
        sessions = [
            {
                "sessionId": item["session_id"],
                "cwd": str(cwd),
                "title": item["title"],
                "updatedAt": item["updated_at"],
            }
            for item in page["sessions"]
        ]
        result: dict[str, Any] = {"sessions": sessions}
        if page["truncated"] and page["next_after"] is not None:
            result["nextCursor"] = page["next_after"]
        return result

    # -- prompts -------------------------------------------------------------------------

    async def prompt(self, method: str, params: Any) -> dict[str, Any]:
        params = _object(params)
        session = self._session(_session_id(params))
        text = _prompt_text(params.get("prompt"))
        if session.queue is not None:
            raise RpcError(rpc.INVALID_REQUEST, "A prompt is already running in this session")
        # The project's connection now: a new one if the daemon was restarted meanwhile,
        # which knows the session's MCP servers only once they are given again.
        client = await self._client(session.cwd)
        if client is not session.client:
            if session.mcp_servers:
                await _give_mcp_servers(client, session.session_id, session.mcp_servers)
            if session.chosen is not None:
                await _selection(client, session.session_id, session.chosen)
        session.client = client
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        session.queue, session.turn_id, session.cancel_requested = queue, None, False
        try:
            started = await _call(
                session.client, "turn.start", {"prompt": text}, session.session_id
            )
            turn_id: str = started["turn_id"]
            session.turn_id = turn_id
            if session.cancel_requested:
                await self._cancel_turn(session)
            view = updates.TurnView(turn_id, session.cwd)
            while True:
                event = await queue.get()
                if event is None:
                    raise RpcError(rpc.INTERNAL_ERROR, "The connection to the service ended")
                if isinstance(event, ToolDetail):
                    if event.turn_id == turn_id:
                        for update in view.detail(event.activity_id, event.detail):
                            self._update(session.session_id, update)
                    continue
                if isinstance(event, ApprovalRequest):
                    if event.turn_id == turn_id and event.approval_id not in session.asked:
                        session.asked.add(event.approval_id)  # a resync sends it again
                        self._spawn(session, self._permission(session, event))
                    continue
                for update in view.updates(event):
                    self._update(session.session_id, update)
                payload = event["payload"]
                if event["event"] == "turn.terminal" and payload["turn_id"] == turn_id:
                    return _answer(payload, session.cancel_requested)
        except asyncio.CancelledError:  # the editor went away: so does its turn
            if session.turn_id is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._cancel_turn(session))
            raise
        finally:
            session.queue, session.turn_id = None, None
            session.asked.clear()

    async def _permission(self, session: Session, request: ApprovalRequest) -> None:
        """Ask the editor about one approval request and answer the core with its choice."""
        assert self.peer is not None
        subject = _subject_key(request)
        if subject in session.rejected:
            decision: str | None = "reject"
        else:
            options = _permission_options(request.options)
            try:
                answer = await self.peer.call(
                    "session/request_permission",
                    {
                        "sessionId": session.session_id,
                        "toolCall": _permission_tool_call(request),
                        "options": options,
                    },
                )
            except RpcError:  # the editor cannot ask: nobody allowed it
                answer = None
            option = _chosen(answer, options)
            if option == "reject_always":
                session.rejected.add(subject)
            if option is not None:
                decision = next(d for d in PERMISSION_OPTIONS[option][1] if d in request.options)
            else:
                # Cancelled: after session/cancel the turn's cancel settles the request;
                # otherwise (or an answer that is no option) nobody allowed it.
                decision = None if session.cancel_requested else "reject"
        if decision is not None:
            with contextlib.suppress(DaemonError, DaemonUnavailable):  # settled meanwhile
                await session.client.answer_approval(request.approval_id, decision)

    def _spawn(self, session: Session, work: Any) -> None:
        task = asyncio.create_task(work)
        session.tasks.add(task)
        task.add_done_callback(session.tasks.discard)

    async def cancel(self, method: str, params: Any) -> None:
        session = self.sessions.get(str(_object(params).get("sessionId")))
        if session is None or session.queue is None:
            return
        session.cancel_requested = True
        if session.turn_id is not None:
            await self._cancel_turn(session)

    async def _cancel_turn(self, session: Session) -> None:
        # unknown_turn: it ended meanwhile; the prompt answers from its terminal.
        await session.client.request("turn.cancel", {"turn_id": session.turn_id})

    # -- plumbing ------------------------------------------------------------------------

    def _update(self, session_id: str, update: dict[str, Any]) -> None:
        assert self.peer is not None
        self.peer.notify("session/update", {"sessionId": session_id, "update": update})

    def _on_event(self, client: Client, event: Any) -> None:
        if isinstance(event, dict | None) and self._login_event(client, event):
            return
        if event is None:  # the connection ended: no running prompt will hear more
            for ended in self.sessions.values():
                if ended.client is client and ended.queue is not None:
                    ended.queue.put_nowait(None)
            return
        if isinstance(event, Overloaded):
            cut = next((s for s in self.sessions.values() if s.turn_id == event.turn_id), None)
            if cut is not None:
                self._spawn(cut, self._resync(cut, event))
            return
        if isinstance(event, ApprovalResolved):
            return  # ACP cannot withdraw a permission request; a late answer is ignored
        if isinstance(event, ApprovalRequest):
            asking = self.sessions.get(event.session_id)
            if asking is not None and asking.queue is not None and asking.client is client:
                asking.queue.put_nowait(event)
            return
        if isinstance(event, FileRequest):
            task = asyncio.create_task(self._file(client, event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if isinstance(event, ToolDetail):
            session = self.sessions.get(event.session_id)
            if session is not None and session.queue is not None and session.client is client:
                session.queue.put_nowait(event)
            return
        session = self.sessions.get(event["session_id"] or "")
        if session is not None and session.queue is not None and session.client is client:
            session.queue.put_nowait(dict(event))

    async def _file(self, client: Client, request: FileRequest) -> None:
        """A file tool's read or write, done by the editor (``fs/*_text_file``)."""
        assert self.peer is not None
        session = self.sessions.get(request.session_id)
        content: str | None = None
        error: str | None = None
        try:
            if session is None or os.path.isabs(request.path):
                raise RpcError(rpc.INVALID_PARAMS, "not a file of this session's project")
            params = {"sessionId": request.session_id, "path": str(session.cwd / request.path)}
            if request.op == "read":
                result = await self.peer.call("fs/read_text_file", params)
                content = result.get("content") if isinstance(result, dict) else None
                if not isinstance(content, str):
                    raise RpcError(rpc.INTERNAL_ERROR, "the editor sent no text")
                if len(content.encode("utf-8")) > MAX_EDITOR_TEXT_BYTES:
                    content = None
                    raise RpcError(rpc.INTERNAL_ERROR, "the file is too large to read")
            else:
                await self.peer.call("fs/write_text_file", {**params, "content": request.content})
        except RpcError as exc:
            error = exc.message
        with contextlib.suppress(DaemonError, DaemonUnavailable, ValueError):
            await client.answer_file(request, content=content, error=error)

    async def _resync(self, session: Session, notice: Overloaded) -> None:
        """Take the turn's events again after an overload cut (the view skips repeats)."""
        result = await session.client.attach(
            notice.turn_id, notice.after_sequence, session_id=session.session_id
        )
        if session.queue is not None:
            for event in result["events"]:
                session.queue.put_nowait(dict(event))

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise RpcError(RESOURCE_NOT_FOUND, "Resource not found", {"sessionId": session_id})
        return session

    async def _client(self, cwd: Path) -> Client:
        try:
            return await self.backend.client(cwd)
        except CoreUnavailable as exc:
            raise RpcError(rpc.INTERNAL_ERROR, str(exc)) from None


async def _set_policy(client: Client, session_id: str, mode: str | None) -> str:
    """Set the session's approval policy in the core (None: the settings'); the mode its
    calls get now (the settings' default when they cannot be read)."""
    try:
        effective = await client.set_session_policy(session_id, mode)
    except (DaemonUnavailable, DaemonError) as exc:
        raise RpcError(
            rpc.INTERNAL_ERROR,
            "The connection to the service ended",
            {"code": getattr(exc, "code", None)},
        ) from None
    return effective or "auto"


async def _modes(client: Client, session_id: str) -> dict[str, Any]:
    """A new or loaded session starts in the settings' policy."""
    current = await _set_policy(client, session_id, None)
    return {"currentModeId": current, "availableModes": MODES}


async def _selection(
    client: Client, session_id: str, chosen: tuple[str, str, str] | None
) -> dict[str, Any]:
    """Set the session's own provider, model and reasoning level in the core (None: the
    settings'); what its turns get now."""
    try:
        if chosen is None:
            return await client.set_session_selection(session_id, None, None)
        try:
            return await client.set_session_selection(session_id, *chosen)
        except DaemonError as exc:
            if exc.code != "unsupported_reasoning":
                raise
            # A model without the level the session had: its default level.
            return await client.set_session_selection(session_id, *chosen[:2], "default")
    except (DaemonUnavailable, DaemonError) as exc:
        code = getattr(exc, "code", None)
        if code in ("invalid_selection", "invalid_request"):
            raise invalid_params("the value is not one of the option's") from None
        raise RpcError(
            rpc.INTERNAL_ERROR, "The model cannot be chosen now", {"code": code}
        ) from None


async def _config_options(client: Client, now: dict[str, Any]) -> list[dict[str, Any]]:
    """The config options of a session whose turns get ``now``: the model (the provider's
    available models in the catalog) and the reasoning level."""
    models: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None and len(models) < MAX_MODEL_OPTIONS:
        payload = {"provider_id": now["provider_id"], "offset": offset}
        try:
            page = await _call(client, "catalog.models", payload)
        except RpcError:
            break  # no catalog: the current model alone
        models += [m for m in page["entries"] if m["available"]]
        offset = page["next_offset"]
    options = [{"value": m["model_id"], "name": m["label"]} for m in models[:MAX_MODEL_OPTIONS]]
    if now["model_id"] not in [o["value"] for o in options]:
        options.insert(0, {"value": now["model_id"], "name": now["model_id"]})
    return [
        {
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": now["model_id"],
            "options": options,
        },
        {
            "id": "thought_level",
            "name": "Reasoning",
            "category": "thought_level",
            "type": "select",
            "currentValue": now["thinking_level"],
            "options": [
                {"value": level, "name": THOUGHT_LEVELS.get(level, level)}
                for level in now["available_thinking_levels"]
            ],
        },
    ]


def _permission_options(offered: tuple[str, ...]) -> list[dict[str, str]]:
    """The ACP options for the core's offered answers (an option needs one of them)."""
    options = []
    for kind, (name, decisions) in PERMISSION_OPTIONS.items():
        if any(d in offered for d in decisions):
            if kind == "allow_always":
                where = "in this project" if "allow_project" in offered else "in this session"
                name = f"{name} {where}"
            options.append({"optionId": kind, "name": name, "kind": kind})
    return options


def _chosen(answer: Any, options: list[dict[str, str]]) -> str | None:
    """The option the editor selected; None when it cancelled or answered nonsense."""
    outcome = answer.get("outcome") if isinstance(answer, dict) else None
    if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
        return None
    option = outcome.get("optionId")
    return option if option in [o["optionId"] for o in options] else None


def _permission_tool_call(request: ApprovalRequest) -> dict[str, Any]:
    """The tool call a permission is about: the same ``toolCallId`` as its session updates,
    with what it would do as title and raw input."""
    summary = request.summary
    if request.kind == "command":
        title = f"Run `{summary.get('command', '')}`"
    elif request.kind == "file_change":
        title = f"Change {summary.get('path', '')}"
    else:
        title = f"MCP tool {summary.get('server', '')}/{summary.get('tool', '')}"
    return {
        "toolCallId": request.activity_id or request.approval_id,
        "title": title,
        "kind": PERMISSION_KINDS.get(request.kind, "other"),
        "status": "pending",
        "rawInput": summary,
    }


def _subject_key(request: ApprovalRequest) -> str:
    """What "always reject" remembers: the exact command, path, or MCP tool."""
    summary = request.summary
    parts = (summary.get("argv"), summary.get("path"), summary.get("server"), summary.get("tool"))
    return f"{request.kind}\x1f{parts!r}"


async def _give_mcp_servers(
    client: Client, session_id: str, servers: list[dict[str, Any]], *, busy_ok: bool = False
) -> None:
    """Make ``servers`` the session's own MCP servers in the core (``session.open`` with
    them, then ``session.close``); ``busy_ok``: a session another client holds is left
    as it is."""
    try:
        await _call(client, "session.open", {}, session_id, mcp_servers=servers)
    except RpcError as error:
        if busy_ok and error.data == {"code": "session_busy"}:
            return
        raise _not_found(error, session_id) from None
    await client.request("session.close", {}, session_id=session_id)


def _not_found(error: RpcError, session_id: str) -> RpcError:
    """A v1 session error as ACP's "resource not found" (others as they are)."""
    if error.data in ({"code": "session_unavailable"}, {"code": "invalid_session_id"}):
        return RpcError(RESOURCE_NOT_FOUND, "Resource not found", {"sessionId": session_id})
    return error


async def _call(
    client: Client,
    method: str,
    payload: dict[str, Any],
    session_id: str | None = None,
    *,
    mcp_servers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A v1 request's payload; its error as the JSON-RPC error it maps to."""
    try:
        reply = await client.request(
            method, payload, session_id=session_id, mcp_servers=mcp_servers
        )
    except (DaemonUnavailable, DaemonError) as exc:  # the core went away (a restart, a stop)
        if getattr(exc, "code", None) == "invalid_mcp_servers":
            raise invalid_params(MCP_SERVERS_REFUSED) from None
        raise RpcError(
            rpc.INTERNAL_ERROR,
            "The connection to the service ended",
            {"code": getattr(exc, "code", None)},
        ) from None
    if reply["error"] is not None or reply["payload"] is None:
        raise _v1_error(reply["error"])
    return reply["payload"]


def _answer(terminal: dict[str, Any], cancel_requested: bool) -> dict[str, Any]:
    reason = updates.stop_reason(terminal, cancel_requested)
    if reason is not None:
        return {"stopReason": reason}
    failure = terminal.get("failure", "internal_error")
    remedy = terminal.get("remedy", "")
    code = rpc.AUTH_REQUIRED if failure in updates.AUTH_FAILURES else rpc.INTERNAL_ERROR
    raise RpcError(code, f"The turn failed: {remedy}", {"failure": failure, "remedy": remedy})


def _v1_error(error: ErrorInfo | None) -> RpcError:
    if error is None:
        return RpcError(rpc.INTERNAL_ERROR, "Internal error")
    if error["code"] in ("invalid_payload", "limit_exceeded"):
        return invalid_params(error["message"])
    return RpcError(rpc.INTERNAL_ERROR, error["message"], {"code": error["code"]})


def _object(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise invalid_params("params must be an object")
    return params


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _session_id(params: dict[str, Any]) -> str:
    session_id = params.get("sessionId")
    if not isinstance(session_id, str) or not session_id:
        raise invalid_params("sessionId must be a string")
    return session_id


def _cwd(value: Any) -> Path:
    if not isinstance(value, str) or "\0" in value or not os.path.isabs(value):
        raise invalid_params("cwd must be an absolute path")
    path = Path(value)
    if not path.is_dir():
        raise invalid_params("cwd is not a directory")
    return path


def _mcp_servers(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The editor's stdio MCP servers as the core takes them (RFC-0002 §6.13); HTTP and
    SSE servers (which ``initialize`` does not offer) are left out. A name becomes a
    server name the core accepts: characters other than letters, digits, ``_.-`` are
    ``_``, cut to 64."""
    servers = params.get("mcpServers")
    if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
        raise invalid_params("mcpServers must be a list of objects")
    stdio: list[dict[str, Any]] = []
    for server in servers:
        if server.get("type") in ("http", "sse", "acp"):
            continue
        name, command = server.get("name"), server.get("command")
        args, env = server.get("args", []), server.get("env", [])
        if not (
            isinstance(name, str)
            and name
            and isinstance(command, str)
            and isinstance(args, list)
            and all(isinstance(a, str) for a in args)
            and isinstance(env, list)
            and all(
                isinstance(e, dict)
                and isinstance(e.get("name"), str)
                and isinstance(e.get("value"), str)
                for e in env
            )
        ):
            raise invalid_params("a stdio MCP server needs a name, a command, args and env")
        stdio.append(
            {
                "name": _UNSAFE_SERVER_NAME.sub("_", name)[:64],
                "command": command,
                "args": list(args),
                "env": {e["name"]: e["value"] for e in env},
            }
        )
    if len({s["name"] for s in stdio}) < len(stdio):
        raise invalid_params("mcpServers names must be unique")
    return stdio


def _prompt_text(blocks: Any) -> str:
    """The prompt's blocks as the user message: text as is, resources as context."""
    if not isinstance(blocks, list) or not blocks:
        raise invalid_params("prompt must be a non-empty list of content blocks")
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            name = block.get("name") if isinstance(block.get("name"), str) else block["uri"]
            parts.append(f"[{name}]({block['uri']})")
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            parts.append(_embedded(block["resource"]))
        else:
            raise invalid_params("unsupported content block (text, resource_link, resource)")
    text = "\n\n".join(parts)
    if not text.strip():
        raise invalid_params("the prompt has no text")
    return text


def _embedded(resource: dict[str, Any]) -> str:
    uri = resource.get("uri")
    if not isinstance(uri, str):
        raise invalid_params("a resource needs a uri")
    text = resource.get("text")
    if isinstance(text, str):
        return f'<context uri="{uri}">\n{text}\n</context>'
    if isinstance(resource.get("blob"), str):
        return f'<context uri="{uri}">(binary content, not shown)</context>'
    raise invalid_params("a resource needs text or blob")


async def serve(ctx: LaunchContext) -> int:
    """Serve ACP on stdin/stdout until the editor closes stdin."""
    agent = Agent(ctx, os.environ.get(MODE_ENV) or "auto")
    reader, write = await rpc.stdio()
    agent.peer = rpc.Peer(reader, write, agent.requests, agent.notifications)
    try:
        await agent.peer.run()
    finally:
        await agent.backend.close()
    return 0
