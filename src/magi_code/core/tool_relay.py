"""What a turn's tools tell or ask the persistent client that started it (RFC-0002 §6.8).

Transport-neutral (the daemon's persistent role drives it). A connection that asked in
its ``hello`` for tool details or editor file access *listens* with a callback that sends
one v2 frame. A turn started by such a connection gets, through
:meth:`ToolRelay.frontend`:

- a detail sink: each main-agent tool call's detail (tool, bounded arguments, locations)
  and each file change's bounded old/new text go to that connection as ``tool_detail``
  frames, never into the turn's events, its replay buffer or the session's history;
- the editor's file system: the file tools' reads and writes become ``fs_request`` frames
  answered by ``fs_result``, each within :data:`FS_TIMEOUT_SECONDS`. While the connection
  is gone (the turn runs on detached) the tools use the disk again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from magi_code.dataclass import dataclass
from magi_code.protocol import v2
from magi_code.protocol.text import one_line
from magi_code.tools.frontend import EditorFailed, Frontend
from magi_code.turns.agent import TOOL_CALL_ACTIVITY

if TYPE_CHECKING:
    from .turns import TurnRun

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]
FS_TIMEOUT_SECONDS: Final = 30.0


@dataclass(frozen=True, slots=True)
class Listener:
    send: Send
    details: bool
    editor_files: frozenset[str]


@dataclass(eq=False, slots=True)
class PendingFs:
    conn_id: int
    future: asyncio.Future[tuple[str | None, str | None]]


class ToolRelay:
    def __init__(self) -> None:
        self._listeners: dict[int, Listener] = {}
        self._pending: dict[str, PendingFs] = {}

    def listen(self, conn_id: int, send: Send, details: bool, editor_files: frozenset[str]) -> None:
        if details or editor_files:
            self._listeners[conn_id] = Listener(send, details, editor_files)

    def unlisten(self, conn_id: int) -> None:
        """The connection ended: its file requests fail (the tools see an error)."""
        self._listeners.pop(conn_id, None)
        for pending in list(self._pending.values()):
            if pending.conn_id == conn_id and not pending.future.done():
                pending.future.set_result((None, "the editor connection ended"))

    def frontend(self, run: TurnRun) -> Frontend:
        """What the turn's tools get of its starting connection."""
        listener = self._listeners.get(run.conn.conn_id)
        if listener is None:
            return Frontend()
        details = _DetailSink(self, run) if listener.details else None
        editor = TurnEditor(self, run) if listener.editor_files else None
        return Frontend(details, editor)

    def answer(self, conn_id: int, fs_id: str, content: str | None, error: str | None) -> None:
        """An ``fs_result``; one for a request that ended (timed out) is dropped."""
        pending = self._pending.get(fs_id)
        if pending is not None and pending.conn_id == conn_id and not pending.future.done():
            pending.future.set_result((content, error))

    def send(self, run: TurnRun, frame: dict[str, Any]) -> bool:
        listener = self._listeners.get(run.conn.conn_id)
        if listener is None:
            return False
        listener.send(frame)
        return True

    def offers(self, run: TurnRun, op: str) -> bool:
        listener = self._listeners.get(run.conn.conn_id)
        return listener is not None and op in listener.editor_files

    async def file_request(
        self, run: TurnRun, op: str, path: str, content: str | None = None
    ) -> str | None:
        fs_id = f"fs_{secrets.token_hex(12)}"
        pending = PendingFs(run.conn.conn_id, asyncio.get_running_loop().create_future())
        frame = v2.fs_request(fs_id, op, path, content, run.turn_id, run.session_id)
        self._pending[fs_id] = pending
        try:
            if not self.send(run, frame):
                raise EditorFailed("The editor is not connected.")
            try:
                answer, error = await asyncio.wait_for(
                    asyncio.shield(pending.future), FS_TIMEOUT_SECONDS
                )
            except TimeoutError:
                log.warning("the editor did not answer a file request in time")
                raise EditorFailed("The editor did not answer in time.") from None
        finally:
            self._pending.pop(fs_id, None)
        if error is not None:
            raise EditorFailed(f"The editor could not {op} {path}: {one_line(error)}")
        return answer


class _DetailSink:
    """The turn's :data:`~magi_code.tools.frontend.DetailSink`: details of the call
    running in this context (``TOOL_CALL_ACTIVITY``)."""

    def __init__(self, relay: ToolRelay, run: TurnRun) -> None:
        self._relay = relay
        self._run = run

    def __call__(self, detail: dict[str, Any]) -> None:
        activity_id = TOOL_CALL_ACTIVITY.get()
        if activity_id is not None:
            run = self._run
            frame = v2.tool_detail(activity_id, detail, run.turn_id, run.session_id)
            self._relay.send(run, frame)


class TurnEditor:
    """The turn's :class:`~magi_code.tools.frontend.EditorFiles`: its starting
    connection's editor while it is connected."""

    def __init__(self, relay: ToolRelay, run: TurnRun) -> None:
        self._relay = relay
        self._run = run

    @property
    def reads(self) -> bool:
        return self._relay.offers(self._run, "read")

    @property
    def writes(self) -> bool:
        return self._relay.offers(self._run, "write")

    async def read_text(self, path: str) -> str:
        text = await self._relay.file_request(self._run, "read", path)
        if text is None:
            raise EditorFailed(f"The editor sent no text for {path}.")
        return text

    async def write_text(self, path: str, content: str) -> None:
        await self._relay.file_request(self._run, "write", path, content)
