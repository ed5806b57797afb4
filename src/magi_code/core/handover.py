"""Control hand-over between connected clients (RFC-0002 §6.1): ``control.request``.

A persistent client asks for a session another connected persistent client controls.
The controller is sent ``control_requested`` and answers grant or refuse. Unanswered for
:attr:`Handover.timeout` seconds (``MC_DAEMON_CONTROL_REQUEST_SECONDS``, default 30), the
request is granted as soon as the session has no running turn. One request per session
waits at a time; the requester's or the controller's disconnection settles it (refused,
or granted: a lost controller's sessions are takeable anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Final

from magi_code.dataclass import dataclass, field
from magi_code.protocol import v2
from magi_code.protocol.errors import ErrorCode, ServiceError

from .coordinator import Connection
from .sessions import Attachment, SessionService

DEFAULT_TIMEOUT_SECONDS: Final = 30.0

Grant = Callable[[Attachment, Connection], None]


class Refused(Exception):
    """The controller refused, or the request could not be granted."""


@dataclass(eq=False, slots=True)
class Pending:
    session_id: str
    requester: Connection
    controller: int
    outcome: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    timer: asyncio.TimerHandle | None = None
    waiter: asyncio.Task[None] | None = None


class Handover:
    def __init__(self, sessions: SessionService, grant: Grant) -> None:
        self.sessions = sessions
        self.timeout = DEFAULT_TIMEOUT_SECONDS
        self._grant = grant
        self._pending: dict[str, Pending] = {}

    async def request(
        self, conn: Connection, session_id: str, ask: Callable[[dict[str, Any]], bool]
    ) -> None:
        """Wait until ``conn`` controls the session; raises :class:`Refused` or
        ServiceError ``session_busy`` (a request already waits, or the controller cannot
        be asked: a v1 shim). ``ask`` sends the controller ``control_requested``."""
        if session_id in self._pending:
            raise ServiceError(ErrorCode.SESSION_BUSY)
        attachment = self.sessions.controller(session_id)
        assert attachment is not None and attachment.owner != conn.conn_id
        pending = Pending(session_id, conn, attachment.owner)
        event = v2.control_requested(session_id, conn.label, int(self.timeout * 1000))
        if not ask(event):
            raise ServiceError(ErrorCode.SESSION_BUSY)
        self._pending[session_id] = pending
        loop = asyncio.get_running_loop()
        pending.timer = loop.call_later(self.timeout, self._expired, pending)
        try:
            await asyncio.shield(pending.outcome)
        finally:
            self._end(pending)

    def answer(self, conn: Connection, session_id: str, grant: bool) -> bool:
        """The controller's answer; False when no request of its session waits."""
        pending = self._pending.get(session_id)
        if pending is None or pending.controller != conn.conn_id:
            return False
        if grant:
            self._give(pending)
        else:
            self._settle(pending, Refused())
        return True

    def controller_lost(self, conn_id: int) -> None:
        """The controller is gone: its sessions go to whoever asked."""
        for pending in [p for p in self._pending.values() if p.controller == conn_id]:
            self._give(pending)

    def released(self, session_id: str) -> None:
        """The controller let go: the waiting request is granted."""
        pending = self._pending.get(session_id)
        if pending is not None:
            self._give(pending)

    def requester_gone(self, conn_id: int) -> None:
        for pending in [p for p in self._pending.values() if p.requester.conn_id == conn_id]:
            self._settle(pending, Refused())

    def _expired(self, pending: Pending) -> None:
        pending.timer = None
        attachment = self.sessions.controller(pending.session_id)
        if attachment is None or not attachment.busy:
            self._give(pending)
        else:
            pending.waiter = asyncio.create_task(self._after_turn(pending, attachment))

    async def _after_turn(self, pending: Pending, attachment: Attachment) -> None:
        while attachment.busy and not pending.outcome.done():
            await attachment.idle.wait()
            await asyncio.sleep(0)  # the turn's own cleanup runs first
        self._give(pending)

    def _give(self, pending: Pending) -> None:
        if pending.outcome.done():
            return
        attachment = self.sessions.controller(pending.session_id)
        try:
            if attachment is not None:  # else released meanwhile: taken as a free one
                self._grant(attachment, pending.requester)
        except ServiceError as exc:
            self._settle(pending, exc)
            return
        self._settle(pending, None)

    def _settle(self, pending: Pending, exc: BaseException | None) -> None:
        if pending.outcome.done():
            return
        if exc is None:
            pending.outcome.set_result(None)
        else:
            pending.outcome.set_exception(exc)

    def _end(self, pending: Pending) -> None:
        if self._pending.get(pending.session_id) is pending:
            del self._pending[pending.session_id]
        if pending.timer is not None:
            pending.timer.cancel()
        if pending.waiter is not None and pending.waiter is not asyncio.current_task():
            pending.waiter.cancel()
        if not pending.outcome.done():
            pending.outcome.cancel()
        with contextlib.suppress(BaseException):
            pending.outcome.exception()
