"""Auth routes: status, the one Codex login worker, callbacks, cancellation, logout.

The login's start request ID stays reserved until its terminal event is written. Progress
events are correlated to the start request with ``session_id: null``; the worker starts
only after the start response was written, so progress always follows it. Auth routes
keep the provider definitions seen at the connection's first auth request (the v1
"startup provider definitions").
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from typing import Any

from magi_code.auth.login import CodexLogin
from magi_code.auth.operations import auth_status, logout
from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import CODEX_PROVIDER_ID
from magi_code.config.settings import ProviderDefinition, all_providers, load_settings
from magi_code.dataclass import dataclass
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError

from .coordinator import Connection
from .output import Batch
from .routes import Endpoint, Reply


@dataclass(eq=False, slots=True)
class ActiveLogin:
    login_id: str
    conn: Connection
    request_id: str
    flow: CodexLogin
    task: asyncio.Task[None] | None = None


class AuthService:
    def __init__(self) -> None:
        self._providers: dict[int, list[ProviderDefinition]] = {}
        self.login: ActiveLogin | None = None

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            "auth.status": Endpoint(self._status),
            "auth.login.start": Endpoint(self._login_start),
            "auth.login.callback": Endpoint(self._login_callback),
            "auth.login.cancel": Endpoint(self._login_cancel),
            "auth.logout": Endpoint(self._logout),
        }

    async def _providers_for(self, conn: Connection) -> list[ProviderDefinition]:
        providers = self._providers.get(conn.conn_id)
        if providers is None:
            try:
                settings = await asyncio.to_thread(load_settings, conn.ctx)
            except ServiceError as exc:
                raise ServiceError(ErrorCode.INTERNAL_ERROR) from exc
            providers = list(all_providers(conn.ctx, settings).values())
            self._providers[conn.conn_id] = providers
        return providers

    async def _status(self, conn: Connection, request: Request, _: object) -> Reply:
        providers = await self._providers_for(conn)
        store = AuthStore(conn.ctx.auth_path)
        return Reply(await asyncio.to_thread(auth_status, conn.ctx, providers, store))

    async def _login_start(
        self, conn: Connection, request: Request, payload: dict[str, Any]
    ) -> Reply:
        provider_id = payload["provider_id"]
        if provider_id != CODEX_PROVIDER_ID:
            raise ServiceError(ErrorCode.PROVIDER_UNAVAILABLE)
        if self.login is not None:
            raise ServiceError(ErrorCode.AUTH_BUSY)
        login_id = f"login_{secrets.token_hex(12)}"

        def emit(state: str, extra: dict[str, Any]) -> None:
            payload = {"login_id": login_id, "provider_id": provider_id, "state": state, **extra}
            event = conn.event(request.request_id, None, "auth.login.progress", payload)
            conn.output.put(Batch([event]))

        flow = CodexLogin(conn.ctx, AuthStore(conn.ctx.auth_path), emit)
        login = ActiveLogin(login_id, conn, request.request_id, flow)
        self.login = login
        return Reply(
            {"login_id": login_id, "provider_id": provider_id, "status": "started"},
            keep_reserved=True,
            after_write=lambda: self._launch(login),
        )

    def _launch(self, login: ActiveLogin) -> None:
        login.task = asyncio.create_task(self._run_login(login))

    async def _run_login(self, login: ActiveLogin) -> None:
        state = await login.flow.run()
        conn = login.conn
        payload = {
            "login_id": login.login_id,
            "provider_id": CODEX_PROVIDER_ID,
            "state": state,
            "cleanup_complete": True,
        }
        event = conn.event(login.request_id, None, "auth.login.terminal", payload)
        batch = Batch([event], after_write=[lambda: conn.release(login.request_id)])
        await conn.output.put(batch).done.wait()
        if self.login is login:
            self.login = None

    def _find(self, conn: Connection, login_id: str) -> ActiveLogin:
        login = self.login
        if login is None or login.login_id != login_id or login.flow.finished:
            raise ServiceError(ErrorCode.UNKNOWN_LOGIN)
        return login

    async def _login_callback(
        self, conn: Connection, request: Request, payload: dict[str, Any]
    ) -> Reply:
        login_id, text = payload["login_id"], payload["input"]
        self._find(conn, login_id).flow.submit_callback(text)
        return Reply({"login_id": login_id, "status": "submitted"})

    async def _login_cancel(
        self, conn: Connection, request: Request, payload: dict[str, Any]
    ) -> Reply:
        login_id = payload["login_id"]
        self._find(conn, login_id).flow.request_cancel()
        return Reply({"login_id": login_id, "status": "cancellation_requested"})

    async def _logout(self, conn: Connection, request: Request, payload: dict[str, Any]) -> Reply:
        provider_id, confirmed = payload["provider_id"], payload.get("confirmed", False)
        providers = await self._providers_for(conn)
        store = AuthStore(conn.ctx.auth_path)
        payload = await asyncio.to_thread(logout, store, provider_id, confirmed, providers)
        if provider_id == CODEX_PROVIDER_ID and self.login is not None:
            self.login.flow.request_cancel()
        return Reply(payload)

    async def connection_closed(self, connection: Connection) -> None:
        self._providers.pop(connection.conn_id, None)
        login = self.login
        if login is None or login.conn is not connection:
            return
        login.flow.request_cancel()
        if login.task is None:
            # Accepted but never started (output already closed): still settle it.
            self._launch(login)
        assert login.task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await login.task
