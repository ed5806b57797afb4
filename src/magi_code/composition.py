"""Composition root: builds one coordinator with every domain service.

Both adapters (embedded stdio and the daemon) call this, so v1 and v2 share one core.

:func:`build_coordinator` builds every service before it returns (the daemon, which
imports the whole product before it is ready anyway, and ``--prompt``, which needs a turn
at once). :func:`build_embedded_coordinator` is for the embedded stdio service, whose
first request is ``initialize``: it builds only ``initialize``/``status``/
``capabilities`` and puts stand-ins for the other services in their place: the same
declared operations and events (``protocol/operations``), so ``initialize`` advertises
exactly what a full build does. The real services and the
modules behind them are then loaded in the background, on the event loop, a module at a
time, once the first response has been written: first what a first turn needs before
its first provider request (``httpx``, providers, settings, sessions, tools, the turn
runtime; the bundled CA roots in a worker thread meanwhile), then the rest of the
services, ``httpx``'s transports, the generated settings schema and the modules a turn
needs only later. A request for a stand-in's route before the services are built builds
them first, synchronously, so every request sees the same services, validation and
errors as with a full build. The embedded service has one connection: when it closes, a
load still in progress stops at its next step (a frontend that quits right after
``initialize`` exits at once; the schema is then left to the next start if the load had
not reached it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from magi_code.core.coordinator import Connection, DomainService, ServiceCoordinator
from magi_code.core.routes import Endpoint, Reply
from magi_code.core.service_info import ServiceInfo
from magi_code.protocol.envelope import Request
from magi_code.protocol.operations import OPERATIONS
from magi_code.storage.launch import LaunchContext

log = logging.getLogger(__name__)


def provider_auth_ready(ctx: LaunchContext) -> bool:
    """Readiness of the current effective selection; no refresh, no network."""
    from magi_code.auth.readiness import is_ready
    from magi_code.auth.store import AuthStore
    from magi_code.config.effective import resolve_effective
    from magi_code.config.settings import load_settings

    settings = load_settings(ctx)
    effective = resolve_effective(ctx, settings)
    snapshot = AuthStore(ctx.auth_path).read()
    return is_ready(ctx, effective.provider or effective.provider_id, snapshot)


async def _write_settings_schema(ctx: LaunchContext) -> None:
    from magi_code.config.schema import write_settings_schema

    try:
        # Startup may create the runtime home and the generated settings schema.
        await asyncio.to_thread(write_settings_schema, ctx)
    except OSError:
        log.warning("could not write the settings schema")


def _domain_services(ctx: LaunchContext) -> dict[str, DomainService]:
    """Every service but ``ServiceInfo``, by the keys of :data:`DEFERRED`, in its order."""
    from magi_code.core.auth import AuthService
    from magi_code.core.configuration import ConfigurationService
    from magi_code.core.sessions import SessionService
    from magi_code.core.settings_gate import SettingsGate
    from magi_code.core.turns import TurnService
    from magi_code.providers.http import HttpClients
    from magi_code.sessions.store import SessionStore
    from magi_code.tools.mcp import McpServers
    from magi_code.turns.runtime import TurnRuntime

    sessions = SessionService(SessionStore(ctx.sessions_dir))
    # One client cache for turns and catalogs: clients per endpoint, credential and the
    # frontend's proxy/CA settings, never one client shared by every frontend.
    clients = HttpClients()
    # Warm MCP servers for every connection's turns. First: a closing connection's turns
    # are drained (services close in reverse order) before its servers are stopped.
    mcp = McpServers()
    runtime = TurnRuntime(clients, mcp)
    gate = SettingsGate()
    return {
        "mcp": mcp,
        "sessions": sessions,
        "turns": TurnService(sessions, runtime, gate),
        "auth": AuthService(),
        "configuration": ConfigurationService(clients, gate),
    }


async def build_coordinator(
    ctx: LaunchContext, transports: Sequence[str] = ("stdio",)
) -> ServiceCoordinator:
    """A coordinator with every domain service built."""
    await _write_settings_schema(ctx)
    coordinator = ServiceCoordinator(transports)
    coordinator.add_service("info", ServiceInfo(coordinator, provider_auth_ready))
    for key, service in _domain_services(ctx).items():
        coordinator.add_service(key, service)
    return coordinator


# -- the embedded service's deferred build -----------------------------------------------


# The keys of ``_domain_services``, in registration order (tests/unit/test_composition.py
# checks them): a stand-in per key takes the operations and events declared as its own.
DEFERRED: Final = ("mcp", "sessions", "turns", "auth", "configuration")

# Imported one at a time, in this order, by the background load, the event loop running in
# between (leaves first, so that most steps are a few milliseconds: the event loop only
# notices stdin, EOF included, between steps), and by ``load()`` when a request needs the
# services first. A first turn's prerequisites come first: the HTTP client and providers,
# settings, sessions, tools and the turn runtime; then what only other routes use. Best
# effort: a name a dependency's version does not have is skipped, and a product module
# that fails fails again when the services are built.
LOAD_STEPS: Final = (
    "email.parser",
    "http.client",
    "urllib.request",
    "httpx",
    "magi_code.providers.types",
    "magi_code.providers.anthropic",
    "magi_code.providers.discovery",
    "magi_code.providers.http",
    "magi_code.providers",
    "magi_code.config.settings",
    "magi_code.config.effective",
    "magi_code.sessions.records",
    "magi_code.sessions.outcomes",
    "magi_code.sessions.store",
    "magi_code.core.sessions",
    "magi_code.tools.files",
    "magi_code.tools.shell",
    "magi_code.tools.builtin",
    "magi_code.turns.agent",
    "magi_code.turns.runtime",
    "magi_code.core.turns",
    "magi_code.config",
    "magi_code.auth.login",
    "magi_code.core.auth",
    "magi_code.core.configuration",
)
# Once this step is done, the bundled CA roots a first HTTPS client needs are loaded in a
# worker thread (~20 ms, mostly outside the GIL) while the event loop loads the rest.
TLS_STEP: Final = "magi_code.providers.http"
# Loaded after the services are built and the HTTP stack is warm: a first turn needs
# neither before its first provider request (psutil: only when a command's process
# group is checked).
LATER_MODULES: Final = ("psutil",)
# How long that later work (those modules, the settings schema file) waits after the rest
# of the load, unless the client disconnects first: a turn sent at once would otherwise
# wait for it between its own steps.
LATER_DELAY: Final = 0.5


class DeferredDomains:
    """The domain services of an embedded coordinator, built once, on the event loop.

    ``start()`` begins the background load (after the first response was written);
    ``load()`` completes it synchronously for a request that needs a service now;
    ``stop()`` (the connection closed) ends a background load at its next step.
    """

    def __init__(self, ctx: LaunchContext) -> None:
        self._ctx = ctx
        self.services: dict[str, DomainService] | None = None
        self._task: asyncio.Task[None] | None = None
        self._roots: asyncio.Future[None] | None = None
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._loaded = asyncio.Event()  # the load itself ended (the later work may not)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._background())

    def _step(self, name: str) -> None:
        with contextlib.suppress(ImportError):
            __import__(name)  # not importlib: ``-X importtime`` shows these
        if name == TLS_STEP and self._roots is None:
            from magi_code.providers.http import warm_bundled_roots

            self._roots = asyncio.get_running_loop().run_in_executor(None, warm_bundled_roots)

    async def _background(self) -> None:
        # The load creates tens of thousands of objects that live as long as the process
        # (modules, classes, functions): cyclic collections meanwhile would free nothing
        # and cost ~5 % of it. They resume when the load ends, however it ends, with what
        # exists then left out of every later collection (``gc.freeze``), so the first
        # one does not walk all of it during a turn.
        collecting = gc.isenabled()
        gc.disable()
        try:
            loaded = await self._load_in_steps()
        finally:
            if collecting:
                gc.freeze()
                gc.enable()
            self._loaded.set()
        if not loaded:
            return
        stopped = not await self._idle_for(LATER_DELAY)
        try:
            # Written even by a client that is already gone (the docs promise the file).
            await _write_settings_schema(self._ctx)
            if not stopped:
                await self._imported(LATER_MODULES)
        except Exception as exc:  # noqa: BLE001 (as in the load, logged, never raised)
            log.warning("could not load the service's modules (%s)", type(exc).__name__)

    async def _load_in_steps(self) -> bool:
        """The services and what a first turn needs; False if stopped or failed first."""
        try:
            for name in LOAD_STEPS:
                if self.stopping():
                    return False
                if self.services is None:
                    self._step(name)
                await asyncio.sleep(0)  # requests that arrived meanwhile are served
            if self.stopping():
                return False
            self.load()
            from magi_code.turns.runtime import TURN_MODULES, warm_turn_modules

            if not await self._imported(TURN_MODULES):
                return False
            warm_turn_modules()  # the rest of it (certifi's bundle path)
            return True
        # A broken install fails the same way again, and is answered, in load().
        except Exception as exc:  # noqa: BLE001
            log.warning("could not load the service's modules (%s)", type(exc).__name__)
            return False

    async def _idle_for(self, seconds: float) -> bool:
        """Wait ``seconds`` unless ``stop()`` is called first; False if it was."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)
        return not self.stopping()

    async def _imported(self, names: Sequence[str]) -> bool:
        """Import ``names`` one at a time, the event loop running in between; False if
        ``stop()`` was called first."""
        for name in names:
            await asyncio.sleep(0)
            if self.stopping():
                return False
            with contextlib.suppress(ImportError):
                __import__(name)
        return True

    def stopping(self) -> bool:
        """Whether ``stop()`` was called (read afresh after every ``await``)."""
        return self._stopping

    def load(self) -> dict[str, DomainService]:
        """The services, built now if the background load has not built them yet.

        Raises whatever importing or building them raises (the request fails with
        ``internal_error``; a later one tries again).
        """
        if self.services is None:
            # The steps' order, not the services' imports, so that the CA roots start
            # loading early here too.
            for name in LOAD_STEPS:
                self._step(name)
            self.services = _domain_services(self._ctx)
        return self.services

    async def settled(self) -> None:
        """Wait for a background load in progress (not for the later work after it)."""
        task = self._task
        if task is not None and not task.done():
            await self._loaded.wait()

    async def ready(self) -> None:
        """Start the load if it has not started, and wait until it is done."""
        self.start()
        await self.settled()

    async def stop(self) -> None:
        """The connection closed: end a background load at its next step (the import in
        progress finishes first), so an exit right after ``initialize`` does not wait
        for modules nothing will use. Services already built are left as they are."""
        self._stopping = True
        self._stop_requested.set()
        task = self._task
        if task is not None and not task.done():
            await asyncio.shield(task)


class _StandIn:
    """A deferred service: its declared operations now, the service itself on first use."""

    def __init__(self, domains: DeferredDomains, key: str) -> None:
        self._domains = domains
        self._key = key
        self._endpoints: Mapping[str, Endpoint] | None = None

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            op.name: Endpoint(self._validator(op.name), self._handler(op.name))
            for op in OPERATIONS
            if op.service == self._key
        }

    def _service(self) -> DomainService:
        return self._domains.load()[self._key]

    def _endpoint(self, name: str) -> Endpoint:
        if self._endpoints is None:
            self._endpoints = self._service().routes()
        return self._endpoints[name]

    def _validator(self, name: str) -> Callable[[Request], Any]:
        def validate(request: Request) -> Any:
            return self._endpoint(name).validate(request)

        return validate

    def _handler(self, name: str) -> Callable[[Connection, Request, Any], Awaitable[Reply | None]]:
        async def handle(conn: Connection, request: Request, parsed: Any) -> Reply | None:
            return await self._endpoint(name).handle(conn, request, parsed)

        return handle

    async def connection_closed(self, connection: Connection) -> None:
        await self._domains.stop()
        if self._domains.services is not None:
            await self._service().connection_closed(connection)

    async def connection_detached(self, connection: Connection) -> None:
        await self._domains.stop()
        if self._domains.services is None:
            return
        service = self._service()
        detached = getattr(service, "connection_detached", None)
        if detached is not None:
            await detached(connection)
        else:
            await service.connection_closed(connection)


class _StartsLoad:
    """``ServiceInfo`` whose answers, once written, start the background load."""

    def __init__(self, info: ServiceInfo, domains: DeferredDomains) -> None:
        self._info = info
        self._domains = domains

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            name: Endpoint(endpoint.validate, self._wrap(endpoint))
            for name, endpoint in self._info.routes().items()
        }

    def _wrap(
        self, endpoint: Endpoint
    ) -> Callable[[Connection, Request, Any], Awaitable[Reply | None]]:
        async def handle(conn: Connection, request: Request, parsed: Any) -> Reply | None:
            reply = await endpoint.handle(conn, request, parsed)
            if reply is not None:
                written = reply.after_write

                def after_write() -> None:
                    if written is not None:
                        written()
                    self._domains.start()

                reply.after_write = after_write
            return reply

        return handle

    async def connection_closed(self, connection: Connection) -> None:
        await self._info.connection_closed(connection)


def _deferred_readiness(
    domains: DeferredDomains, loop: asyncio.AbstractEventLoop
) -> Callable[[LaunchContext], bool]:
    def ready(ctx: LaunchContext) -> bool:
        # Runs in a worker thread (``status``): the modules it needs are imported by the
        # load on the event loop, never by two threads at once.
        asyncio.run_coroutine_threadsafe(domains.ready(), loop).result()
        return provider_auth_ready(ctx)

    return ready


async def build_embedded_coordinator(
    ctx: LaunchContext, transports: Sequence[str] = ("stdio",)
) -> ServiceCoordinator:
    """A coordinator that answers ``initialize`` before its domain services are loaded."""
    domains = DeferredDomains(ctx)
    coordinator = ServiceCoordinator(transports)
    info = ServiceInfo(coordinator, _deferred_readiness(domains, asyncio.get_running_loop()))
    coordinator.add_service("info", _StartsLoad(info, domains))
    for key in DEFERRED:
        coordinator.add_service(key, _StandIn(domains, key))
    return coordinator
