"""The transport-neutral service coordinator.

Theory of operation: an adapter opens a ``Connection`` per client (the v1 stdio process
has exactly one), feeds it complete records, and drains ``connection.output`` in order.
The coordinator decodes each record, applies request-ID reservations, validates the
method payload, applies the initialization gate, and routes to a domain service. Domain
services own their workers; at connection end the coordinator asks each to cancel and
drain that connection's work before the adapter writes the last batches.

Reservation rules (spec "Envelope"): every safe request ID is reserved from decode until
its response batch has been written; start requests keep theirs until the terminal event
is written. Duplicates are rejected without touching the original reservation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from magi_code.protocol import envelope
from magi_code.protocol.envelope import Identity, Rejected, Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.operations import EVENTS, OPERATIONS, DeclaredOperation
from magi_code.storage.launch import LaunchContext

from .output import Batch, Output, TurnEvent
from .routes import Endpoint, Reply, RequestExpired, Route, SessionRule, Validator

if TYPE_CHECKING:
    from magi_code.protocol.v2 import McpServer

log = logging.getLogger(__name__)


class DomainService(Protocol):
    """A domain's contribution: the endpoints of the operations declared as its own (by
    name), and its connection cleanup. Its events are declared too."""

    def routes(self) -> Mapping[str, Endpoint]: ...

    async def connection_closed(self, connection: Connection) -> None:
        """Cancel and drain the work this connection owns; emit its terminal events."""


class Connection:
    """One client: its launch context, initialization state, reservations and output."""

    def __init__(
        self,
        coordinator: ServiceCoordinator,
        ctx: LaunchContext,
        conn_id: int,
        transports: Sequence[str],
        server_version: str | None = None,
        *,
        persistent: bool = False,
    ) -> None:
        self.coordinator = coordinator
        self.ctx = ctx
        self.conn_id = conn_id
        # Advertised per connection: a v1 shim of the daemon still speaks only "stdio".
        self.transports = tuple(transports)
        # ``initialize.server_version``: the client's installed package (a daemon client
        # sends its own), else this process's.
        self.server_version = server_version
        # A persistent (v2) client: its turn admission captures settings (RFC-0002 §6.6);
        # a v1 client's turn workers reload them instead.
        self.persistent = persistent
        # A persistent client that negotiated approvals (RFC-0002 §6.7): its turns may ask.
        self.approvals = False
        # Who this client is to others (a watcher's ``turn_started``, approvals' ``by``).
        self.label = f"client#{conn_id}"
        # A queue runner's session (RFC-0002 §6.12): it starts that session's queued
        # turns on the attachment of the session's controller, if one holds it.
        self.queue_of: str | None = None
        self.output = Output()
        self.initialized = False
        self.reserved: set[str] = set()

    @property
    def speaks_stdio(self) -> bool:
        """Whether the v1 stdio contract governs this client (embedded, or a v1 shim of
        the daemon), not the persistent v2 protocol."""
        return "stdio" in self.transports

    def reserve(self, request_id: str) -> None:
        self.reserved.add(request_id)

    def release(self, request_id: str) -> None:
        self.reserved.discard(request_id)

    def respond(
        self,
        request: Request,
        payload: dict[str, Any] | None = None,
        error: ServiceError | None = None,
        *,
        session_id: str | None = None,
        events: Iterable[TurnEvent] = (),
        keep_reserved: bool = False,
        after_write: Callable[[], None] | None = None,
    ) -> Batch:
        """Enqueue a correlated response (used directly by deferred handlers)."""
        identity = Identity(request.request_id, session_id or request.session_id, request.method)
        turn_events = tuple(events)
        messages = [envelope.response(identity, payload, error)]
        messages.extend(event.envelope for event in turn_events)
        batch = Batch(messages, turn_events=turn_events)
        if not keep_reserved:
            batch.after_write.append(lambda: self.release(request.request_id))
        if after_write is not None:
            batch.after_write.append(after_write)
        return self.output.put(batch)

    def event(
        self, request_id: str | None, session_id: str | None, name: str, payload: dict[str, Any]
    ) -> dict[str, Any]:
        return envelope.event(
            self.coordinator.next_event_id(), request_id, session_id, name, payload
        )

    async def answered(self, batch: Batch, writer: asyncio.Future[Any]) -> bool:
        """Wait until ``batch``, the answer to the request just handled, is written (or
        ``writer``, the adapter's output task, ended); whether the next request may be
        handled.

        Every adapter handles a request only once the answer to the one before it is
        written (v1: each outbound batch is written before the next input record is
        processed), so after an output failure no request read after that answer takes
        effect: False then (the output is closed), and the adapter handles no more input.
        Events of running turns and answers of workers are written meanwhile.
        """
        if not batch.done.is_set():
            waiter = asyncio.ensure_future(batch.done.wait())
            try:
                await asyncio.wait({waiter, writer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        return batch.done.is_set() and not self.output.closed


def _validator(op: DeclaredOperation, check: Validator | None) -> Validator:
    """``op``'s declared checks, then the endpoint's ``check``: what its handler gets."""

    def validate(request: Request) -> Any:
        op.check(request.payload, request.session_id)
        return request.payload if check is None else check(request)

    return validate


class ServiceCoordinator:
    def __init__(self, transports: Sequence[str]) -> None:
        self.transports = tuple(transports)
        self._routes: dict[str, Route] = {}
        self._keys: set[str] = set()
        # Bumped whenever the route table changes (caches of advertised names key on it).
        self.routes_version = 0
        self._services: list[DomainService] = []
        self._event_ids = itertools.count(1)
        self._conn_ids = itertools.count(1)
        self.connections: dict[int, Connection] = {}

    # -- composition -------------------------------------------------------------------

    def add_service(self, key: str, service: DomainService) -> None:
        """Route the operations declared as ``key``'s to ``service``'s endpoints (it must
        supply exactly those)."""
        endpoints = service.routes()
        declared = [op for op in OPERATIONS if op.service == key]
        if set(endpoints) != {op.name for op in declared}:
            raise ValueError(f"service {key!r} does not handle exactly its declared operations")
        self._services.append(service)
        self._keys.add(key)
        for op in declared:
            endpoint = endpoints[op.name]
            session = SessionRule(op.session)
            validate = _validator(op, endpoint.check)
            self._routes[op.name] = Route(op.name, validate, endpoint.handle, session, op.gated)
        self.routes_version += 1

    @property
    def services(self) -> tuple[DomainService, ...]:
        return tuple(self._services)

    @property
    def operations(self) -> list[str]:
        """The names of the routed operations, in declaration order."""
        return [op.name for op in OPERATIONS if op.name in self._routes]

    @property
    def events(self) -> list[str]:
        """The events of the composed services, in declaration order."""
        return [ev.name for ev in EVENTS if ev.service in self._keys]

    def next_event_id(self) -> str:
        return f"evt-{next(self._event_ids)}"

    # -- connections -------------------------------------------------------------------

    def open_connection(
        self,
        ctx: LaunchContext,
        transports: Sequence[str] | None = None,
        server_version: str | None = None,
        *,
        persistent: bool = False,
    ) -> Connection:
        conn = Connection(
            self,
            ctx,
            next(self._conn_ids),
            transports or self.transports,
            server_version,
            persistent=persistent,
        )
        self.connections[conn.conn_id] = conn
        return conn

    async def close_connection(self, conn: Connection, *, detach: bool = False) -> None:
        """Cancel and drain everything the connection owns, then let output finish.

        ``detach`` (a lost persistent v2 client): services that offer
        ``connection_detached`` let that connection's accepted work run to its end
        instead of cancelling it; everything else (its login) is cancelled as usual.
        """
        for service in reversed(self._services):
            detached = getattr(service, "connection_detached", None) if detach else None
            if detached is not None:
                await detached(conn)
            else:
                await service.connection_closed(conn)
        self.connections.pop(conn.conn_id, None)
        conn.output.finish()

    # -- records -----------------------------------------------------------------------

    def reject_oversize(self, conn: Connection) -> Batch:
        error = ServiceError(ErrorCode.RECORD_TOO_LARGE)
        return conn.output.put(Batch([envelope.response(Identity(), None, error)]))

    async def handle_record(self, conn: Connection, line: bytes) -> Batch | None:
        """Handle one inbound record; returns the batch that answers it, if synchronous."""
        return await self._handle(conn, envelope.decode_record(line, conn.reserved.__contains__))

    async def handle_message(
        self,
        conn: Connection,
        message: object,
        *,
        idempotency_key: str | None = None,
        deadline_ms: int | None = None,
        mcp_servers: tuple[McpServer, ...] | None = None,
    ) -> Batch | None:
        """Handle a request envelope already decoded by a transport (v2 ``request``).

        Raises :class:`RequestExpired` (its ID released, nothing answered) when the
        deadline passed while the handler waited.
        """
        decoded = envelope.decode_object(message, conn.reserved.__contains__)
        extras = idempotency_key or deadline_ms is not None or mcp_servers is not None
        if isinstance(decoded, Request) and extras:
            decoded = dataclasses.replace(
                decoded,
                idempotency_key=idempotency_key,
                deadline_ms=deadline_ms,
                mcp_servers=mcp_servers,
            )
        return await self._handle(conn, decoded)

    async def _handle(self, conn: Connection, decoded: Request | Rejected) -> Batch | None:
        if isinstance(decoded, Rejected):
            return self._reject(conn, decoded)
        request = decoded
        conn.reserve(request.request_id)
        try:
            reply = await self._dispatch(conn, request)
        except ServiceError as exc:
            return conn.respond(request, error=exc)
        except RequestExpired:
            conn.release(request.request_id)
            raise
        except Exception:  # the one exception-to-wire boundary
            log.exception("request handler failed (method=%s)", request.method)
            return conn.respond(request, error=ServiceError(ErrorCode.INTERNAL_ERROR))
        if reply is None:
            return None
        return conn.respond(
            request,
            reply.payload,
            session_id=reply.session_id,
            events=reply.events,
            keep_reserved=reply.keep_reserved,
            after_write=reply.after_write,
        )

    def _reject(self, conn: Connection, rejected: Rejected) -> Batch:
        batch = Batch([envelope.response(rejected.identity, None, ServiceError(rejected.code))])
        request_id = rejected.identity.request_id
        if request_id is not None and not rejected.duplicate:
            # A fresh safe ID stays reserved until its error response is written.
            conn.reserve(request_id)
            batch.after_write.append(lambda: conn.release(request_id))
        return conn.output.put(batch)

    async def _dispatch(self, conn: Connection, request: Request) -> Reply | None:
        route = self._routes.get(request.method)
        if route is None:
            raise ServiceError(ErrorCode.UNSUPPORTED_OPERATION)
        if route.session is SessionRule.FORBIDDEN and request.session_id is not None:
            raise ServiceError(ErrorCode.INVALID_REQUEST)
        if route.session is SessionRule.REQUIRED and request.session_id is None:
            raise ServiceError(ErrorCode.INVALID_SESSION_ID)
        parsed = route.validate(request)
        if route.gated and not conn.initialized:
            raise ServiceError(ErrorCode.NOT_INITIALIZED)
        return await route.handle(conn, request, parsed)
