"""The embedded coordinator answers like a full build while its services load later.

The stand-ins must advertise exactly the routes (names, session rules, gate, order) and
events of the services they stand for, answer every request as those services would
(the same validation errors, in the same order as the gate), load in the background
once the first answer was written, and leave nothing half-done at connection close.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code import composition
from magi_code.composition import (
    DEFERRED,
    LATER_MODULES,
    LOAD_STEPS,
    TLS_STEP,
    DeferredDomains,
    build_coordinator,
    build_embedded_coordinator,
)
from magi_code.core.coordinator import Connection, ServiceCoordinator
from magi_code.core.output import Batch
from magi_code.protocol import envelope
from magi_code.providers.http import bundled_ssl_context
from magi_code.storage.launch import LaunchContext

INIT = {"supported_protocol_versions": [1]}


@pytest.fixture
def ctx(tmp_path: Path) -> LaunchContext:
    home = tmp_path / "home"
    home.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    return LaunchContext(home, project, {})


@pytest.fixture
async def embedded(ctx: LaunchContext) -> AsyncIterator[ServiceCoordinator]:
    coordinator = await build_embedded_coordinator(ctx)
    yield coordinator
    for conn in list(coordinator.connections.values()):
        await coordinator.close_connection(conn)


def domains_of(coordinator: ServiceCoordinator) -> DeferredDomains:
    found = {getattr(s, "_domains", None) for s in coordinator.services} - {None}
    assert len(found) == 1
    domains = found.pop()
    assert isinstance(domains, DeferredDomains)
    return domains


def route_table(coordinator: ServiceCoordinator) -> list[tuple[str, str, bool]]:
    routes = coordinator._routes
    return [(name, route.session.value, route.gated) for name, route in routes.items()]


async def call(
    coordinator: ServiceCoordinator,
    conn: Connection,
    method: str,
    payload: dict[str, Any] | None = None,
    session_id: str | None = None,
    *,
    write: bool = True,
) -> dict[str, Any]:
    """Send one request and return its response; ``write`` settles its batch (as the
    adapter does once it wrote it)."""
    rid = f"r-{method}-{len(conn.reserved)}-{id(payload)}"
    record = orjson.dumps(envelope.request(rid, method, payload, session_id))
    batch = await coordinator.handle_record(conn, record)
    if batch is None:  # answered later, through the output
        while True:
            queued = await asyncio.wait_for(conn.output.get(), 10)
            assert isinstance(queued, Batch)
            if queued.messages[0].get("request_id") == rid:
                batch = queued
                break
            queued.written()
    if write:
        batch.written()
    response: dict[str, Any] = batch.messages[0]
    return response


async def test_the_stand_ins_advertise_what_the_services_do(ctx: LaunchContext) -> None:
    full = await build_coordinator(ctx)
    embedded = await build_embedded_coordinator(ctx)
    assert route_table(embedded) == route_table(full)
    assert embedded.operations == full.operations
    assert embedded.events == full.events
    # A stand-in per service, in the services' order (each handles its declared
    # operations: the coordinator refuses a service that does not).
    assert list(DEFERRED) == list(composition._domain_services(ctx))


async def test_nothing_loads_before_the_first_answer_is_written(
    embedded: ServiceCoordinator, ctx: LaunchContext
) -> None:
    domains = domains_of(embedded)
    conn = embedded.open_connection(ctx)
    response = await call(embedded, conn, "initialize", INIT, write=False)
    assert response["error"] is None
    assert response["payload"]["capabilities"]["operations"] == embedded.operations
    await asyncio.sleep(0.05)
    assert domains.services is None
    assert not (ctx.mc_home / "settings.schema.json").exists()


async def test_the_written_answer_starts_the_load_in_the_background(
    embedded: ServiceCoordinator, ctx: LaunchContext
) -> None:
    domains = domains_of(embedded)
    conn = embedded.open_connection(ctx)
    assert (await call(embedded, conn, "initialize", INIT))["error"] is None
    await asyncio.wait_for(domains.settled(), 30)
    assert domains.services is not None
    assert set(domains.services) == set(DEFERRED)
    assert gc.isenabled()  # paused during the load only
    # The settings schema is written a little later, once a first turn would have begun.
    assert not (ctx.mc_home / "settings.schema.json").exists()
    await asyncio.sleep(composition.LATER_DELAY)
    for _ in range(300):
        if (ctx.mc_home / "settings.schema.json").is_file():
            break
        await asyncio.sleep(0.01)
    assert (ctx.mc_home / "settings.schema.json").is_file()


async def test_a_close_after_the_load_ends_the_wait_for_the_later_work(
    embedded: ServiceCoordinator, ctx: LaunchContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    domains = domains_of(embedded)
    imported: list[str] = []
    real = domains._imported

    async def recording(names: Any) -> bool:
        imported.extend(names)
        return await real(names)

    monkeypatch.setattr(domains, "_imported", recording)
    conn = embedded.open_connection(ctx)
    assert (await call(embedded, conn, "initialize", INIT))["error"] is None
    await asyncio.wait_for(domains.settled(), 30)
    assert not (ctx.mc_home / "settings.schema.json").exists()
    # stop() ends the wait: the task is over when it returns, the schema written anyway,
    # the later modules never imported.
    await asyncio.wait_for(domains.stop(), 30)
    assert domains._task is not None and domains._task.done()
    assert (ctx.mc_home / "settings.schema.json").is_file()
    assert not set(LATER_MODULES) & set(imported)


async def test_a_request_before_the_load_is_served_by_the_real_service(
    embedded: ServiceCoordinator, ctx: LaunchContext
) -> None:
    domains = domains_of(embedded)
    conn = embedded.open_connection(ctx)
    # The initialize answer is never written: no background load was started.
    await call(embedded, conn, "initialize", INIT, write=False)
    created = await call(embedded, conn, "session.create")
    assert created["error"] is None and created["payload"]["session_id"]
    assert domains.services is not None
    listed = await call(embedded, conn, "session.list")
    assert [s["session_id"] for s in listed["payload"]["sessions"]] == [
        created["payload"]["session_id"]
    ]


# Requests whose errors depend on the order of session rules, validation and the gate.
EARLY_REQUESTS: list[tuple[str, dict[str, Any] | None, str | None]] = [
    ("turn.start", {"prompt": ""}, None),
    ("turn.start", {"prompt": "hi"}, None),
    ("turn.start", {"prompt": "hi", "options": {"x": 1}}, "not a session id"),
    ("session.open", None, None),
    ("session.list", None, "sess"),
    ("session.list", {"limit": "x"}, None),
    ("auth.logout", {"provider_id": 7}, None),
    ("config.set", {"scope": "nowhere"}, None),
    ("catalog.models", None, None),
    ("no.such.method", None, None),
    ("status", None, None),
]


async def test_errors_before_initialize_are_those_of_a_full_build(ctx: LaunchContext) -> None:
    answers = []
    for build in (build_coordinator, build_embedded_coordinator):
        coordinator = await build(ctx)
        conn = coordinator.open_connection(ctx)
        try:
            answers.append(
                [
                    (await call(coordinator, conn, method, payload, session))["error"]
                    for method, payload, session in EARLY_REQUESTS
                ]
            )
        finally:
            await coordinator.close_connection(conn)
    full, embedded = answers
    assert embedded == full
    assert {error["code"] for error in full if error} >= {"invalid_payload", "not_initialized"}


async def test_status_waits_for_the_load_and_answers_as_a_full_build(
    embedded: ServiceCoordinator, ctx: LaunchContext
) -> None:
    conn = embedded.open_connection(ctx)
    await call(embedded, conn, "initialize", INIT)
    status = await call(embedded, conn, "status")
    assert status["error"] is None
    assert status["payload"] == {"service": "ready", "provider_auth_ready": False}
    assert domains_of(embedded).services is not None


async def test_closing_right_after_initialize_stops_the_load(ctx: LaunchContext) -> None:
    coordinator = await build_embedded_coordinator(ctx)
    domains = domains_of(coordinator)
    conn = coordinator.open_connection(ctx)
    await call(coordinator, conn, "initialize", INIT)  # written: the load was started
    await asyncio.wait_for(coordinator.close_connection(conn), 10)
    assert domains.services is None  # nothing left running, nothing built for nobody
    # A later request (another connection) still gets the real services.
    other = coordinator.open_connection(ctx)
    await call(coordinator, other, "initialize", INIT)
    assert (await call(coordinator, other, "session.list"))["error"] is None
    await coordinator.close_connection(other)


async def test_closing_after_the_load_closes_the_real_services(ctx: LaunchContext) -> None:
    coordinator = await build_embedded_coordinator(ctx)
    domains = domains_of(coordinator)
    conn = coordinator.open_connection(ctx)
    await call(coordinator, conn, "initialize", INIT)
    created = await call(coordinator, conn, "session.create")
    session_id = created["payload"]["session_id"]
    await asyncio.wait_for(domains.settled(), 30)
    await coordinator.close_connection(conn)
    # The session service released the connection's attachment: another may open it.
    other = coordinator.open_connection(ctx)
    await call(coordinator, other, "initialize", INIT)
    opened = await call(coordinator, other, "session.open", None, session_id)
    assert opened["error"] is None, opened
    await coordinator.close_connection(other)


async def test_a_failing_load_fails_the_request_and_the_next_one_tries_again(
    embedded: ServiceCoordinator, ctx: LaunchContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = embedded.open_connection(ctx)
    await call(embedded, conn, "initialize", INIT, write=False)
    real = composition._domain_services

    def broken(_: LaunchContext) -> Any:
        raise ImportError("half-replaced install")

    monkeypatch.setattr(composition, "_domain_services", broken)
    failed = await call(embedded, conn, "session.list")
    assert failed["error"]["code"] == "internal_error"
    monkeypatch.setattr(composition, "_domain_services", real)
    assert (await call(embedded, conn, "session.list"))["error"] is None


def test_every_step_of_the_load_names_a_module() -> None:
    # The load skips a name that cannot be imported: a typo would only show as time.
    for name in (*LOAD_STEPS, *LATER_MODULES):
        assert importlib.util.find_spec(name) is not None, name
    assert TLS_STEP in LOAD_STEPS


async def test_a_request_that_builds_the_services_starts_loading_the_ca_roots(
    embedded: ServiceCoordinator, ctx: LaunchContext
) -> None:
    bundled_ssl_context.cache_clear()
    domains = domains_of(embedded)
    conn = embedded.open_connection(ctx)
    await call(embedded, conn, "initialize", INIT, write=False)
    assert (await call(embedded, conn, "session.list"))["error"] is None
    roots = domains._roots
    assert roots is not None
    await asyncio.wait_for(roots, 30)
    assert bundled_ssl_context.cache_info().currsize == 1
