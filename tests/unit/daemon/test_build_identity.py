"""Build identity over the in-memory transport: welcome/status, replacing an idle daemon,
``upgrade_pending`` on a busy one, and ``server_version`` of a client's own install."""

from __future__ import annotations

import pytest
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon
from tests.support.v2peer import Peer

from magi_code.client import Client, DaemonDraining
from magi_code.protocol import v2
from magi_code.version import build_id, package_version

OTHER = "9.9.9+0123456789abcdef"


def test_build_id_is_the_version_and_a_digest() -> None:
    version, _, digest = build_id().partition("+")
    assert version == package_version() and len(digest) == 16
    int(digest, 16)


async def test_welcome_and_status_carry_the_build(daemon: InMemoryDaemon) -> None:
    client = Client(await daemon.channel("control", build=build_id()))
    try:
        assert client.welcome["build_id"] == build_id()
        status = await client.status()
        assert status["build_id"] == build_id()
        assert status["upgrade_pending"] is False and status["restart_pending"] is False
    finally:
        await client.close()
    assert not daemon.server.core.draining  # the same build never makes way


async def test_an_idle_daemon_refuses_another_build_as_draining_and_stops(
    daemon: InMemoryDaemon,
) -> None:
    with pytest.raises(DaemonDraining):
        await daemon.channel("v1_shim", build=OTHER)
    assert daemon.server.core.draining and daemon.server.stop_reason == "upgrade"


async def test_a_busy_daemon_serves_another_build_and_stops_once_idle(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    user = await Peer.over(await daemon.channel("persistent"))
    newer = await daemon.channel("persistent", build=OTHER)
    server = daemon.server
    assert server.upgrade_pending and not server.core.draining
    assert server.status()["upgrade_pending"] is True
    # A control client of another build marks nothing more and stops nothing.
    control = await daemon.channel("control", build=OTHER)
    await control.close()
    assert not server.core.draining
    fake.enqueue(Reply(text=["still ", "served"]))
    started = await user.request("turn.start", {"prompt": "hi"})
    events = await user.turn_events(started["payload"]["turn_id"])
    assert events[-1]["payload"]["status"] == "completed"
    await user.close()
    await newer.close()
    await daemon.server._stop.wait()  # the watcher stops it once nothing is connected
    assert server.stop_reason == "upgrade"


async def test_initialize_reports_the_clients_installed_version(daemon: InMemoryDaemon) -> None:
    peer = await Peer.over(await daemon.channel("persistent"), initialize=False)
    try:
        answer = await peer.request("initialize", {"supported_protocol_versions": [1]})
        # The client library sends its package version; the daemon itself says "test".
        assert answer["payload"]["server_version"] == package_version()
        assert daemon.server.version == "test"
    finally:
        await peer.close()


@pytest.mark.parametrize(
    "field, value",
    [
        ("build_id", 7),
        ("build_id", "x" * 129),
        ("client_version", ["1"]),
        ("client_version", "v" * 65),
    ],
)
def test_a_malformed_build_or_version_is_an_invalid_hello(field: str, value: object) -> None:
    frame = v2.hello("control", None, "t", "1.0")
    frame[field] = value
    with pytest.raises(v2.Fatal) as raised:
        v2.parse_hello(frame)
    assert raised.value.code is v2.Code.INVALID_HELLO
