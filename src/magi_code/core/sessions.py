"""Session routes and attachments (explicit and implicit writer leases).

An attachment is one client's hold on a session: the durable writer lease (a flock the
kernel drops if the process dies) plus in-memory state. A v1 stdio service is one client;
in the daemon every v1 shim connection is its own client, so two frontends never write
one session, whether they are two processes or two connections of one daemon.

Explicit attachments (create/open) survive turns until close or disconnect. A turn
without one takes an implicit attachment that is released after its terminal output and
worker cleanup. A close during a turn marks the attachment closing and cancels the turn;
the lease is released once the turn has finished.

A turn left without a terminal by a process that died (kill -9, a crash) gets its
``failed`` terminal when this service takes the session's lease (open, a control grant,
a turn's implicit attachment): no turn can be running then. An older one asked for by
``attach`` (RFC-0002 §6) is closed under whichever attachment of this service holds the
session, or under a lease of its own when none does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from magi_code.config.settings import Layer
from magi_code.dataclass import dataclass, field
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import (
    MAX_SESSION_ATTACHMENTS,
    MAX_SESSION_PAGE_ITEMS,
)
from magi_code.sessions.outcomes import TurnOutcome
from magi_code.sessions.store import SessionStore, WriterLease

from .coordinator import Connection
from .routes import Endpoint, Reply, required_session

if TYPE_CHECKING:
    from magi_code.protocol.v2 import McpServer

log = logging.getLogger(__name__)

# Sessions given MCP servers (RFC-0002 §6.13), or a selection (§6.15), of their own that
# the service keeps at once.
MAX_SESSIONS_WITH_MCP_SERVERS: Final = 4096


@dataclass(eq=False, slots=True)
class Attachment:
    session_id: str
    owner: int
    lease: WriterLease
    explicit: bool
    closing: bool = False
    # Its controller let go during a turn (``control.release``): anyone may take it, and
    # its lease is released when the turn ends if nobody did.
    released: bool = False
    # Set while a turn runs on this session: cancels it (close during a turn).
    cancel_turn: Callable[[], None] | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def busy(self) -> bool:
        return self.cancel_turn is not None


def _acts_for(conn: Connection, attachment: Attachment) -> bool:
    """``conn`` holds ``attachment``, or runs its session's queue (RFC-0002 §6.12): the
    queue's turns run on the controller's attachment, under its control."""
    return attachment.owner == conn.conn_id or conn.queue_of == attachment.session_id


class TurnRunning(Exception):
    """A change between turns was asked for while a turn runs on the session."""


def _nothing_to_cancel() -> None:
    """A close during a recovery write waits for it (there is no turn to cancel)."""


class SessionService:
    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._attachments: dict[str, Attachment] = {}
        self._releasing: dict[str, asyncio.Event] = {}
        # Told when a connection takes a session's lease here (the prompt queue resumes).
        self.served: Callable[[Connection, str], None] | None = None
        # Each session's own MCP servers, joined to the configured ones for its turns:
        # in memory only (their env may hold secrets), for the service's life.
        self._mcp_servers: dict[str, tuple[McpServer, ...]] = {}
        # Each session's own selection and reasoning (RFC-0002 §6.15), in memory only.
        self._selections: dict[str, Layer] = {}

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            "session.list": Endpoint(self._list),
            "session.create": Endpoint(self._create),
            "session.open": Endpoint(self._open),
            "session.replay": Endpoint(self._replay),
            "session.close": Endpoint(self._close),
        }

    # -- a session's own MCP servers --------------------------------------------------------

    def mcp_servers(self, session_id: str) -> tuple[McpServer, ...]:
        return self._mcp_servers.get(session_id, ())

    def _check_mcp_room(
        self, session_id: str | None, servers: tuple[McpServer, ...] | None
    ) -> None:
        """Refuse (before anything changes) servers for one session too many."""
        full = len(self._mcp_servers) >= MAX_SESSIONS_WITH_MCP_SERVERS
        if servers and session_id not in self._mcp_servers and full:
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)

    def _set_mcp_servers(self, session_id: str, servers: tuple[McpServer, ...] | None) -> None:
        """The request's servers replace the session's (none given: they stay; an empty
        list removes them)."""
        if servers:
            self._mcp_servers[session_id] = servers
        elif servers is not None:
            self._mcp_servers.pop(session_id, None)

    # -- a session's own selection and reasoning -------------------------------------------

    def selection(self, session_id: str) -> Layer | None:
        return self._selections.get(session_id)

    def set_selection(self, session_id: str, selection: Layer | None) -> bool:
        """Give the session its own selection (None: the settings' again); False when
        too many sessions have one."""
        if selection is None:
            self._selections.pop(session_id, None)
            return True
        full = len(self._selections) >= MAX_SESSIONS_WITH_MCP_SERVERS
        if session_id not in self._selections and full:
            return False
        self._selections[session_id] = selection
        return True

    # -- attachment bookkeeping (also used by turns) --------------------------------------

    def held(self) -> int:
        """Sessions attached to a connection (each holds its writer lease)."""
        return len(self._attachments)

    def owned(self, conn: Connection) -> list[Attachment]:
        return [a for a in self._attachments.values() if a.owner == conn.conn_id]

    def holds(self, conn: Connection, attachment: Attachment) -> bool:
        """``conn`` still controls ``attachment``: registered, its own, not closing."""
        return (
            self._attachments.get(attachment.session_id) is attachment
            and _acts_for(conn, attachment)
            and not attachment.closing
        )

    def _check_capacity(self, conn: Connection) -> None:
        if len(self.owned(conn)) >= MAX_SESSION_ATTACHMENTS:
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)

    def _existing(self, conn: Connection, session_id: str) -> Attachment | None:
        attachment = self._attachments.get(session_id)
        if attachment is None:
            return None
        if not _acts_for(conn, attachment) or attachment.closing:
            raise ServiceError(ErrorCode.SESSION_BUSY)
        return attachment

    async def attach(
        self, conn: Connection, session_id: str, *, explicit: bool, created: bool = False
    ) -> Attachment:
        """Reuse this client's attachment or take the writer lease for a new one (and
        close the turn a dead process left open, unless the session was just ``created``)."""
        attachment = self._existing(conn, session_id)
        if attachment is not None:
            attachment.explicit |= explicit
            return attachment
        self._check_capacity(conn)
        if (releasing := self._releasing.get(session_id)) is not None:
            await releasing.wait()
            return await self.attach(conn, session_id, explicit=explicit, created=created)
        take = self.store.acquire_writer_lease if created else self._take_lease
        lease = await asyncio.to_thread(take, session_id)
        # Another request of this loop may have attached meanwhile (the lease call
        # would then have failed with session_busy, so this is our lease).
        attachment = Attachment(session_id, conn.conn_id, lease, explicit)
        attachment.idle.set()
        self._attachments[session_id] = attachment
        if self.served is not None and not created:
            self.served(conn, session_id)
        return attachment

    def _take_lease(self, session_id: str) -> WriterLease:
        lease = self.store.acquire_writer_lease(session_id)
        try:
            if self.store.close_last_interrupted_turn(lease) is not None:
                log.info("recovered the outcome of an interrupted turn")
        except BaseException:
            lease.release()
            raise
        return lease

    async def create(self, conn: Connection, *, explicit: bool) -> Attachment:
        self._check_capacity(conn)
        session_id = await asyncio.to_thread(self.store.create, conn.ctx.project_dir)
        return await self.attach(conn, session_id, explicit=explicit, created=True)

    async def close_interrupted_turn(self, session_id: str, turn_id: str) -> TurnOutcome | None:
        """``SessionStore.close_interrupted_turn``, under this service's attachment of the
        session when there is one (its lease excludes any other).

        Raises:
            ServiceError: as the store's; ``SESSION_BUSY`` while a turn runs on (or a close
                releases) this service's attachment.
        """
        while (releasing := self._releasing.get(session_id)) is not None:
            await releasing.wait()
        attachment = self._attachments.get(session_id)
        if attachment is None:
            return await asyncio.to_thread(self.store.close_interrupted_turn, session_id, turn_id)
        if attachment.busy or attachment.closing:
            raise ServiceError(ErrorCode.SESSION_BUSY)
        # Claimed as a turn claims it: no turn starts and no close releases it meanwhile.
        attachment.cancel_turn = _nothing_to_cancel
        attachment.idle.clear()
        try:
            return await asyncio.to_thread(
                self.store.close_interrupted_turn, session_id, turn_id, attachment.lease
            )
        finally:
            attachment.cancel_turn = None
            attachment.idle.set()
            await self.turn_finished(attachment)  # a close meanwhile releases it now

    async def release(self, attachment: Attachment) -> None:
        if self._attachments.get(attachment.session_id) is attachment:
            del self._attachments[attachment.session_id]
        # Until the lease is really dropped, a new attach of this session waits for it
        # (otherwise it would meet our own lock and report session_busy).
        done = self._releasing.setdefault(attachment.session_id, asyncio.Event())
        try:
            await asyncio.to_thread(attachment.lease.release)
        finally:
            done.set()
            if self._releasing.get(attachment.session_id) is done:
                del self._releasing[attachment.session_id]

    async def turn_finished(self, attachment: Attachment) -> None:
        """After a turn's terminal output and cleanup: drop implicit or closing holds.

        The turn marked the attachment idle when its terminal was written; since then a
        newer turn may have claimed it (its own finish settles it) or a close released it.
        """
        if attachment.busy or self._attachments.get(attachment.session_id) is not attachment:
            return
        if attachment.closing or attachment.released or not attachment.explicit:
            await self.release(attachment)

    async def take(
        self, conn: Connection, session_id: str, revoked: Callable[[int], bool]
    ) -> Attachment:
        """A control grant (RFC-0002 §6): make ``conn`` the session's one controller.

        A free session is attached as by ``session.open``. An attachment whose owner
        ``revoked`` names (a lost persistent client) moves to ``conn`` with its running
        turn; any other holder keeps it (``session_busy``).
        """
        attachment = self._attachments.get(session_id)
        if attachment is None or attachment.owner == conn.conn_id:
            return await self.attach(conn, session_id, explicit=True)
        if attachment.closing or not (attachment.released or revoked(attachment.owner)):
            raise ServiceError(ErrorCode.SESSION_BUSY)
        self.hand_over(attachment, conn)
        return attachment

    def hand_over(self, attachment: Attachment, conn: Connection) -> None:
        """Move ``attachment`` (and its running turn) to ``conn`` as an explicit one."""
        self._check_capacity(conn)
        attachment.owner = conn.conn_id
        attachment.explicit = True
        attachment.released = False

    def controller(self, session_id: str) -> Attachment | None:
        """The session's attachment here (None when no connection holds it)."""
        attachment = self._attachments.get(session_id)
        return None if attachment is None or attachment.closing else attachment

    @contextlib.asynccontextmanager
    async def claimed(self, conn: Connection, session_id: str) -> AsyncIterator[WriterLease]:
        """The session's writer lease for a change of its history made between turns (a
        rewind, RFC-0002 §6.16): under ``conn``'s attachment, or an implicit one taken as
        a turn takes it; no turn starts and no close releases it meanwhile.

        Raises:
            TurnRunning: a turn runs on the session here.
            ServiceError: ``SESSION_BUSY`` (another client or process holds it), and as
                ``attach``.
        """
        held = self._attachments.get(session_id)
        if held is not None and held.busy:
            raise TurnRunning
        attachment = await self.attach(conn, session_id, explicit=False)
        if attachment.busy:
            raise TurnRunning
        attachment.cancel_turn = _nothing_to_cancel
        attachment.idle.clear()
        try:
            yield attachment.lease
        finally:
            attachment.cancel_turn = None
            attachment.idle.set()
            await self.turn_finished(attachment)

    async def release_control(self, conn: Connection, session_id: str) -> bool:
        """``control.release``: give up ``conn``'s hold (False when it held none).

        With no turn running the lease is released now; during a turn the attachment
        is marked released (takeable by anyone) and released after the turn.
        """
        attachment = self._attachments.get(session_id)
        if attachment is None or attachment.owner != conn.conn_id or attachment.closing:
            return False
        if attachment.busy:
            attachment.released = True
        else:
            await self.release(attachment)
        return True

    async def connection_closed(self, connection: Connection) -> None:
        # Turns were drained first (the turn service closes before this one).
        for attachment in self.owned(connection):
            # Until no turn claims it: a queued turn may claim it as the last one ends.
            while not attachment.idle.is_set():
                await attachment.idle.wait()
            if attachment.owner == connection.conn_id:  # not granted to another meanwhile
                await self.release(attachment)

    # -- routes --------------------------------------------------------------------------

    async def _list(self, conn: Connection, request: Request, payload: dict[str, Any]) -> Reply:
        after, limit = payload.get("after"), payload.get("limit", MAX_SESSION_PAGE_ITEMS)
        # Past the scan budget the v1 stdio contract answers limit_exceeded; a persistent
        # (v2) client pages through the examined entries, told ``incomplete``.
        page = functools.partial(
            self.store.list_sessions, after, limit, page_past_budget=not conn.speaks_stdio
        )
        return Reply(await asyncio.to_thread(page))

    async def _create(self, conn: Connection, request: Request, _: object) -> Reply:
        self._check_mcp_room(None, request.mcp_servers)
        attachment = await self.create(conn, explicit=True)
        self._set_mcp_servers(attachment.session_id, request.mcp_servers)
        return Reply({"session_id": attachment.session_id, "status": "open"}, attachment.session_id)

    async def _open(self, conn: Connection, request: Request, _: object) -> Reply:
        session_id = required_session(request)
        self._check_mcp_room(session_id, request.mcp_servers)
        await self.attach(conn, session_id, explicit=True)
        self._set_mcp_servers(session_id, request.mcp_servers)
        return Reply({"session_id": session_id, "status": "open"}, session_id)

    async def _replay(self, conn: Connection, request: Request, payload: dict[str, Any]) -> Reply:
        session_id = required_session(request)
        after, limit = payload.get("after"), payload.get("limit", MAX_SESSION_PAGE_ITEMS)
        return Reply(await asyncio.to_thread(self.store.replay, session_id, after, limit))

    async def _close(self, conn: Connection, request: Request, _: object) -> Reply:
        session_id = required_session(request)
        attachment = self._attachments.get(session_id)
        if attachment is None or attachment.owner != conn.conn_id:
            # Idempotent for any valid ID; never touches another client's lease.
            return Reply({"session_id": session_id, "status": "closed"})
        if attachment.busy:
            attachment.closing = True
            if attachment.cancel_turn is not None:
                attachment.cancel_turn()
            return Reply({"session_id": session_id, "status": "closing"})
        await self.release(attachment)
        return Reply({"session_id": session_id, "status": "closed"})
