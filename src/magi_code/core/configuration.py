"""Catalog and configuration routes through one configuration worker.

The worker handles one request at a time; another catalog/config request meanwhile gets
``configuration_busy``. The reader is not held up by it: the response is written when the
work is done, so turn output and cancellation stay live during a slow refresh. The
worker counts as busy, and the request ID stays reserved, until that response has been
written; shutdown drains the worker instead of cancelling it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from magi_code.auth.credentials import CredentialsError, resolve_headers
from magi_code.auth.store import AuthStore
from magi_code.config.catalog import model_page, provider_page, refresh, resolve_provider
from magi_code.config.effective import apply_config_set, effective_config
from magi_code.config.payloads import (
    parse_config_set,
    parse_empty,
    parse_model_page,
    parse_provider_page,
    parse_refresh,
)
from magi_code.config.settings import load_settings
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError

from .coordinator import Connection
from .routes import Reply, Route
from .settings_gate import SettingsGate

Work = Callable[[Connection, Any], Awaitable[dict[str, Any]]]


def _validate(parse: Callable[[object], Any]) -> Callable[[Request], Any]:
    return lambda request: parse(request.payload)


def _validate_set(request: Request) -> dict[str, Any]:
    # Checked whole before the gate; the writer re-validates under its lock.
    parse_config_set(request.payload)
    return request.payload


class ConfigurationService:
    def __init__(self, client: httpx.AsyncClient, gate: SettingsGate) -> None:
        self._client = client
        self._gate = gate
        self._busy = False
        self._worker: asyncio.Task[None] | None = None

    def routes(self) -> Sequence[Route]:
        return (
            Route(
                "catalog.providers", _validate(parse_provider_page), self._deferred(self._providers)
            ),
            Route("catalog.models", _validate(parse_model_page), self._deferred(self._models)),
            Route("catalog.refresh", _validate(parse_refresh), self._deferred(self._refresh)),
            Route("config.get", _validate(parse_empty), self._deferred(self._get)),
            Route("config.set", _validate_set, self._deferred(self._set)),
        )

    def events(self) -> Sequence[str]:
        return ()

    def _deferred(
        self, work: Work
    ) -> Callable[[Connection, Request, Any], Awaitable[Reply | None]]:
        async def handle(conn: Connection, request: Request, parsed: Any) -> Reply | None:
            if self._busy:
                raise ServiceError(ErrorCode.CONFIGURATION_BUSY)
            self._busy = True
            self._worker = asyncio.create_task(self._run(work, conn, request, parsed))
            return None

        return handle

    async def _run(self, work: Work, conn: Connection, request: Request, parsed: Any) -> None:
        try:
            payload = await work(conn, parsed)
        except ServiceError as exc:
            batch = conn.respond(request, error=exc)
        except Exception:  # noqa: BLE001 - the worker's one failure boundary
            batch = conn.respond(request, error=ServiceError(ErrorCode.INTERNAL_ERROR))
        else:
            batch = conn.respond(request, payload)
        await batch.done.wait()
        self._busy = False

    async def connection_closed(self, connection: Connection) -> None:
        worker = self._worker
        if worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    # -- the five routes -------------------------------------------------------------------

    async def _providers(self, conn: Connection, page: tuple[int, int]) -> dict[str, Any]:
        settings = await asyncio.to_thread(load_settings, conn.ctx)
        return provider_page(conn.ctx, settings, *page)

    async def _models(self, conn: Connection, page: tuple[str, int, int]) -> dict[str, Any]:
        settings = await asyncio.to_thread(load_settings, conn.ctx)
        return await asyncio.to_thread(model_page, conn.ctx, settings, *page)

    async def _refresh(self, conn: Connection, provider_id: str) -> dict[str, Any]:
        ctx = conn.ctx
        settings = await asyncio.to_thread(load_settings, ctx)
        provider = resolve_provider(ctx, settings, provider_id)
        try:
            headers = await resolve_headers(ctx, provider, AuthStore(ctx.auth_path), self._client)
        except CredentialsError as exc:
            raise ServiceError(ErrorCode.CATALOG_REFRESH_FAILED) from exc
        return await refresh(ctx, settings, provider_id, self._client, headers)

    async def _get(self, conn: Connection, _: None) -> dict[str, Any]:
        settings = await asyncio.to_thread(load_settings, conn.ctx)
        return await asyncio.to_thread(effective_config, conn.ctx, settings)

    async def _set(self, conn: Connection, payload: dict[str, Any]) -> dict[str, Any]:
        with self._gate.write():
            return await asyncio.to_thread(apply_config_set, conn.ctx, payload)
