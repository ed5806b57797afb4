"""Catalog and configuration routes: one worker per connection, writes per scope.

Theory of operation:

- **Per connection**: each connection has its own configuration worker that handles one
  request at a time; another catalog/config request *from the same connection* meanwhile
  gets ``configuration_busy`` (a v1 service is one client, so this is the v1 "one
  configuration worker"). The worker is free as soon as its answer is *queued* on the
  connection's output: a frontend that stops reading holds up nobody but itself. Its
  request ID stays reserved until the answer has been written (the coordinator's rule),
  and a connection with ``MAX_UNWRITTEN_ANSWERS`` answers still unwritten gets
  ``configuration_busy`` instead of queueing more.
- **Per scope**: work that writes takes its scope's slot, shared by every connection of
  the service; a write whose slot is held gets ``configuration_busy``. Scopes are the
  files written: ``config.set`` a settings file (global: ``$MC_HOME/settings.json``;
  project: ``<project>/.magi-code/settings.json``), ``catalog.refresh`` one provider's
  cache file under the ``$MC_HOME`` catalog directory. Reads (``config.get``,
  ``catalog.providers``, ``catalog.models``) take no slot: every file is replaced
  atomically, so a read sees the old or the new file, never half of one.
- A ``config.set`` also passes the settings gate (never overlapping a turn's settings
  capture, service-wide).
- A connection's end drains *its* in-flight request only (never cancels it, never waits
  for another connection's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from magi_code.auth.credentials import CredentialsError, resolve_headers
from magi_code.auth.store import AuthStore
from magi_code.config.catalog import model_page, provider_page, refresh, resolve_provider
from magi_code.config.effective import apply_config_set, effective_config
from magi_code.config.settings import Scope, load_settings, settings_path
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_CATALOG_PAGE_ITEMS
from magi_code.providers.http import HttpClients, transport_options
from magi_code.storage.launch import LaunchContext

from .coordinator import Connection
from .routes import Endpoint, Reply
from .settings_gate import SettingsGate

Work = Callable[[Connection, Any], Awaitable[dict[str, Any]]]
# What a request writes, derived from its parsed payload (``None``: it only reads).
ScopeOf = Callable[[Connection, Any], tuple[str, ...] | None]

# Answers a connection may have queued but not yet written before it gets busy.
MAX_UNWRITTEN_ANSWERS: Final = 16


def _path(path: os.PathLike[str]) -> str:
    # Lexical only (no I/O on the coordinator): two spellings of one directory through
    # a symlink are two scopes, and the settings files' own locks still serialize them.
    return os.path.normpath(os.path.abspath(path))


def settings_scope(ctx: LaunchContext, scope: Scope) -> tuple[str, ...]:
    return ("settings", _path(settings_path(ctx, scope)))


def catalog_scope(ctx: LaunchContext, provider_id: str) -> tuple[str, ...]:
    return ("catalog", _path(ctx.catalog_dir), provider_id)


def _set_scope(conn: Connection, payload: dict[str, Any]) -> tuple[str, ...]:
    return settings_scope(conn.ctx, Scope(payload["scope"]))


def _refresh_scope(conn: Connection, payload: dict[str, Any]) -> tuple[str, ...]:
    return catalog_scope(conn.ctx, payload["provider_id"])


def _page(payload: dict[str, Any]) -> tuple[int, int]:
    """A catalog page's ``(offset, limit)``, defaults filled in."""
    return payload.get("offset", 0), payload.get("limit", MAX_CATALOG_PAGE_ITEMS)


def _reads(conn: Connection, parsed: Any) -> None:
    return None


class ConfigurationService:
    def __init__(self, clients: HttpClients, gate: SettingsGate) -> None:
        self._clients = clients
        self._gate = gate
        # conn_id -> the connection's one in-flight request.
        self._workers: dict[int, asyncio.Task[None]] = {}
        # conn_id -> answers queued and not yet written.
        self._unwritten: dict[int, int] = {}
        self._scopes: set[tuple[str, ...]] = set()

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            "catalog.providers": Endpoint(self._deferred(self._providers, _reads)),
            "catalog.models": Endpoint(self._deferred(self._models, _reads)),
            "catalog.refresh": Endpoint(self._deferred(self._refresh, _refresh_scope)),
            "config.get": Endpoint(self._deferred(self._get, _reads)),
            "config.set": Endpoint(self._deferred(self._set, _set_scope)),
        }

    def busy(self, conn: Connection) -> bool:
        """Whether ``conn`` has a configuration request in flight."""
        return conn.conn_id in self._workers

    def scope_held(self, scope: tuple[str, ...]) -> bool:
        return scope in self._scopes

    def _deferred(
        self, work: Work, scope_of: ScopeOf
    ) -> Callable[[Connection, Request, Any], Awaitable[Reply | None]]:
        async def handle(conn: Connection, request: Request, parsed: Any) -> Reply | None:
            # Decided synchronously, before any await: the answer is immediate and exact.
            if (
                conn.conn_id in self._workers
                or self._unwritten.get(conn.conn_id, 0) >= MAX_UNWRITTEN_ANSWERS
            ):
                raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
            scope = scope_of(conn, parsed)
            if scope is not None and scope in self._scopes:
                raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
            if scope is not None:
                self._scopes.add(scope)
            self._workers[conn.conn_id] = asyncio.create_task(
                self._run(work, conn, request, parsed, scope)
            )
            return None

        return handle

    async def _run(
        self,
        work: Work,
        conn: Connection,
        request: Request,
        parsed: Any,
        scope: tuple[str, ...] | None,
    ) -> None:
        payload: dict[str, Any] | None = None
        error: ServiceError | None = None
        try:
            payload = await work(conn, parsed)
        except ServiceError as exc:
            error = exc
        except Exception:  # noqa: BLE001 - the worker's one failure boundary
            error = ServiceError(ErrorCode.INTERNAL_ERROR)
        finally:
            # Free the slot and the worker in the same step the answer is queued: a
            # request that follows the answer always finds them free.
            if scope is not None:
                self._scopes.discard(scope)
            self._workers.pop(conn.conn_id, None)
        conn_id = conn.conn_id
        self._unwritten[conn_id] = self._unwritten.get(conn_id, 0) + 1
        conn.respond(request, payload, error, after_write=lambda: self._written(conn_id))

    def _written(self, conn_id: int) -> None:
        left = self._unwritten.get(conn_id, 0) - 1
        if left > 0:
            self._unwritten[conn_id] = left
        else:
            self._unwritten.pop(conn_id, None)

    async def connection_closed(self, connection: Connection) -> None:
        # Only this connection's own request; it runs to its answer (settled unwritten
        # when the output is already closed).
        worker = self._workers.get(connection.conn_id)
        if worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    # -- the five routes -------------------------------------------------------------------

    async def _providers(self, conn: Connection, payload: dict[str, Any]) -> dict[str, Any]:
        settings = await asyncio.to_thread(load_settings, conn.ctx)
        return provider_page(conn.ctx, settings, *_page(payload))

    async def _models(self, conn: Connection, payload: dict[str, Any]) -> dict[str, Any]:
        settings = await asyncio.to_thread(load_settings, conn.ctx)
        page = (payload["provider_id"], *_page(payload))
        return await asyncio.to_thread(model_page, conn.ctx, settings, *page)

    async def _refresh(self, conn: Connection, payload: dict[str, Any]) -> dict[str, Any]:
        provider_id = payload["provider_id"]
        ctx = conn.ctx
        settings = await asyncio.to_thread(load_settings, ctx)
        provider = resolve_provider(ctx, settings, provider_id)
        # This frontend's proxy and CAs (its launch environment, the settings' network).
        http = self._clients.bound(transport_options(ctx.env, settings.network))
        try:
            headers = await resolve_headers(ctx, provider, AuthStore(ctx.auth_path), http)
        except CredentialsError as exc:
            raise ServiceError(ErrorCode.CATALOG_REFRESH_FAILED) from exc
        return await refresh(ctx, settings, provider_id, http, headers)

    async def _get(self, conn: Connection, _: object) -> dict[str, Any]:
        settings = await asyncio.to_thread(load_settings, conn.ctx)
        return await asyncio.to_thread(effective_config, conn.ctx, settings)

    async def _set(self, conn: Connection, payload: dict[str, Any]) -> dict[str, Any]:
        with self._gate.write():
            return await asyncio.to_thread(apply_config_set, conn.ctx, payload)
