"""The ACP adapter's way to the core: one persistent (v2) connection per project.

A persistent connection's project directory is its hello's launch context (RFC-0002 §3),
so ACP sessions of different ``cwd`` get different connections; sessions of one project
share one. Every connection answers approval requests (``options.approvals``), which the
agent turns into ``session/request_permission``. In the default mode (``MC_SERVICE_MODE``
unset or ``auto``) a connection goes to the per-user daemon, which the client library
starts when none answers, under the
same liveness and build-upgrade rules as the v1 shim's; ``daemon`` never falls back,
``embedded`` runs a daemon server in this process and connects to it through the
in-memory transport. Either way the adapter is a client of the same coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from magi_code.client import Channel, Client, DaemonError, DaemonStartError, DaemonUnavailable
from magi_code.client.connection import hello_options
from magi_code.storage.launch import LaunchContext

log = logging.getLogger(__name__)

CLIENT_NAME = "acp"
MODE_ENV = "MC_SERVICE_MODE"

# The v1 initialize every connection sends before anything else.
INITIALIZE = {"supported_protocol_versions": [1]}

EventSink = Callable[[Client, Any], None]


class CoreUnavailable(Exception):
    """No core could be reached (daemon mode) or started; the message is for people."""


class Backend:
    """Connections to the core by project directory; events go to ``on_event``."""

    def __init__(self, ctx: LaunchContext, mode: str, on_event: EventSink) -> None:
        self.ctx = ctx
        self.mode = mode
        self._on_event = on_event
        self._clients: dict[Path, Client] = {}
        self._connecting: dict[Path, asyncio.Lock] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._embedded: Any = None  # the in-process DaemonServer (embedded mode)
        self._embedded_task: asyncio.Task[None] | None = None
        # ``hello`` options of new connections (RFC-0002 §3): what this editor offers.
        self.options: dict[str, Any] = {}

    async def client(self, project: Path) -> Client:
        lock = self._connecting.setdefault(project, asyncio.Lock())
        async with lock:
            client = self._clients.get(project)
            if client is None:
                client = await self._connect(dataclasses.replace(self.ctx, project_dir=project))
                reply = await client.request("initialize", INITIALIZE)
                if reply["error"] is not None:
                    await client.close()
                    raise CoreUnavailable("the service refused to initialize")
                self._clients[project] = client
                pump = asyncio.create_task(self._pump(project, client))
                self._pumps.add(pump)
                pump.add_done_callback(self._pumps.discard)
            return client

    async def _connect(self, ctx: LaunchContext) -> Client:
        if self.mode != "embedded":
            try:
                return await Client.connect(
                    ctx, client_name=CLIENT_NAME, options=self.options, approvals=True
                )
            except (DaemonUnavailable, DaemonError, DaemonStartError, OSError) as exc:
                if self.mode == "daemon":
                    raise CoreUnavailable(f"the daemon cannot be reached: {exc}") from None
                if self._embedded is None:
                    sys.stderr.write("magi-code: no daemon could be reached; running in-process\n")
                self.mode = "embedded"
        return Client(await self._embedded_channel(ctx))

    async def _embedded_channel(self, ctx: LaunchContext) -> Channel:
        from magi_code.composition import build_coordinator
        from magi_code.daemon import memory
        from magi_code.daemon.server import DaemonServer
        from magi_code.version import build_id, package_version

        if self._embedded is None:
            coordinator = await build_coordinator(self.ctx, ("unix",))
            self._embedded = DaemonServer(
                coordinator,
                mc_home=self.ctx.mc_home,
                socket_path=self.ctx.mc_home / "acp-in-process",  # never bound
                version=package_version(),
                build_id=build_id(),
                idle_seconds=None,
                mode="embedded",
            )
            self._embedded_task = asyncio.create_task(self._embedded.run_until_stopped())
        reader, writer = memory.connect(self._embedded)
        return await Channel.handshake(
            cast(asyncio.StreamReader, reader),
            cast(asyncio.StreamWriter, writer),
            "persistent",
            ctx,
            client_name=CLIENT_NAME,
            options={**(hello_options(approvals=True) or {}), **self.options},
        )

    async def _pump(self, project: Path, client: Client) -> None:
        try:
            async for event in client.events():
                self._on_event(client, event)
        except (DaemonError, DaemonUnavailable) as exc:
            log.warning("the core connection ended: %s", type(exc).__name__)
        finally:
            if self._clients.get(project) is client:
                del self._clients[project]
            self._on_event(client, None)

    async def close(self) -> None:
        for client in list(self._clients.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        for pump in list(self._pumps):
            pump.cancel()
        if self._embedded is not None and self._embedded_task is not None:
            self._embedded.request_stop("end of input")
            with contextlib.suppress(Exception):
                await self._embedded_task
