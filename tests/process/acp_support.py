"""An ACP editor for the process tests: the official Python SDK (``agent-client-protocol``)
as the client of ``magi-code --app acp``, with every message the agent writes validated
against the SDK's models of the ACP v1 schema."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from acp import schema
from acp.client.connection import ClientSideConnection
from acp.connection import StreamDirection, StreamEvent
from acp.exceptions import RequestError
from acp.stdio import spawn_agent_process
from pydantic import BaseModel

from tests.support.service import service_env

# The result model of each agent method the tests call.
RESULTS: dict[str, type[BaseModel]] = {
    "initialize": schema.InitializeResponse,
    "authenticate": schema.AuthenticateResponse,
    "session/new": schema.NewSessionResponse,
    "session/load": schema.LoadSessionResponse,
    "session/list": schema.ListSessionsResponse,
    "session/prompt": schema.PromptResponse,
    "session/set_mode": schema.SetSessionModeResponse,
    "session/set_config_option": schema.SetSessionConfigOptionResponse,
}
CLIENT_REQUESTS: dict[str, type[BaseModel]] = {
    "fs/read_text_file": schema.ReadTextFileRequest,
    "fs/write_text_file": schema.WriteTextFileRequest,
    "session/request_permission": schema.RequestPermissionRequest,
}


def _strict(model: type[BaseModel], data: Any) -> None:
    """Valid, and nothing dropped or salvaged: the model gives back exactly ``data``."""
    parsed = model.model_validate(data)
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == data, data


class Editor:
    """The client side: records session updates; checks every message against the schema."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.methods: dict[Any, str] = {}  # our request IDs -> method
        self.violations: list[str] = []
        # session/request_permission: the requests (as sent), and the option ID to answer
        # each with, in order (None: the cancelled outcome), which the test puts here.
        self.permissions: list[dict[str, Any]] = []
        self.replies: asyncio.Queue[str | None] = asyncio.Queue()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_unset=True))
        self.changed.set()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> schema.RequestPermissionResponse:
        self.permissions.append(
            {
                "toolCall": tool_call.model_dump(mode="json", by_alias=True, exclude_unset=True),
                "options": [
                    o.model_dump(mode="json", by_alias=True, exclude_unset=True) for o in options
                ],
            }
        )
        self.changed.set()
        reply = await self.replies.get()
        if reply is None:
            return schema.RequestPermissionResponse(
                outcome=schema.DeniedOutcome(outcome="cancelled")
            )
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(option_id=reply, outcome="selected")
        )

    async def wait_for(self, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for update in self.updates:
                    if predicate(update):
                        return update
                self.changed.clear()
                await self.changed.wait()

    def observe(self, event: StreamEvent) -> None:
        message = event.message
        try:
            if event.direction is StreamDirection.OUTGOING:
                if "method" in message and "id" in message:
                    self.methods[message["id"]] = message["method"]
                return
            if message.get("method") == "session/update":
                _strict(schema.SessionNotification, message["params"])
            elif message.get("method") in CLIENT_REQUESTS:
                _strict(CLIENT_REQUESTS[message["method"]], message["params"])
            elif "id" in message and "result" in message:
                method = self.methods.get(message["id"])
                if method in RESULTS:
                    _strict(RESULTS[method], message["result"])
            elif "error" in message:
                _strict(schema.Error, message["error"])
            else:
                raise AssertionError(f"unexpected message {message}")
        except Exception as exc:  # the SDK swallows observer errors: keep them
            self.violations.append(f"{exc!r}")


class BufferEditor(Editor):
    """An editor with ``fs/read_text_file`` and ``fs/write_text_file`` over in-memory
    buffers by absolute path (what it has open, saved or not); anything else is not found."""

    def __init__(self, buffers: dict[str, str]) -> None:
        super().__init__()
        self.buffers = buffers
        self.file_calls: list[tuple[str, str]] = []

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> schema.ReadTextFileResponse:
        self.file_calls.append(("read", path))
        if path not in self.buffers:
            raise RequestError.resource_not_found(path)
        return schema.ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> schema.WriteTextFileResponse:
        self.file_calls.append(("write", path))
        self.buffers[path] = content
        return schema.WriteTextFileResponse()


def text_prompt(text: str) -> list[schema.TextContentBlock]:
    """A ``session/prompt`` of one text block."""
    return [schema.TextContentBlock(type="text", text=text)]


def tool_calls(updates: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tool call's fields as the editor ends up knowing them (its ``tool_call`` with
    every later ``tool_call_update`` applied), by ID, in the order they began."""
    calls: dict[str, dict[str, Any]] = {}
    for update in updates:
        if update["sessionUpdate"] in ("tool_call", "tool_call_update"):
            call = calls.setdefault(update["toolCallId"], {})
            call.update({k: v for k, v in update.items() if k != "sessionUpdate"})
    return calls


@contextlib.asynccontextmanager
async def acp_agent(
    home: Path, project: Path, env: Mapping[str, str] | None = None, editor: Editor | None = None
) -> AsyncIterator[tuple[ClientSideConnection, Editor]]:
    """``magi-code --app acp`` started in ``project`` (the mode matrix stops its daemon)."""
    editor = editor or Editor()
    async with spawn_agent_process(
        editor,
        sys.executable,
        "-m",
        "magi_code",
        "--app",
        "acp",
        env=service_env(home, env),
        cwd=project,
        transport_kwargs={"limit": 16 << 20, "shutdown_timeout": 20.0},
        observers=[editor.observe],
    ) as (conn, _process):
        yield conn, editor
        assert editor.violations == []


def texts(updates: list[dict[str, Any]], kind: str) -> str:
    return "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == kind)
