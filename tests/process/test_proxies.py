"""Provider and catalog HTTP honour the frontend's proxy settings, through the real
service: the launch environment's HTTP(S)_PROXY/NO_PROXY (in both modes; in daemon mode
the daemon's own environment has none of them) and the settings' ``network.proxy``."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.process.turn_support import run_turn, write_settings
from tests.support.fake_providers import FakeModel, FakeProviderServer, Reply
from tests.support.service import running_service

PROXY_PASSWORD = "proxy-secret-pw-0000"


class ForwardingProxy:
    """A plain-HTTP forwarding proxy on 127.0.0.1 (absolute-URI requests, no CONNECT).

    One request per client connection: the request goes to the target in origin form with
    ``connection: close``, the response comes back with ``connection: close``. Records
    each request line and its ``proxy-authorization`` header.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.authorization: list[str | None] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, version = line.split(" ", 2)
            headers = [tuple(h.split(":", 1)) for h in header_lines]
            lowered = {k.strip().lower(): v.strip() for k, v in headers}
            self.lines.append(line)
            self.authorization.append(lowered.get("proxy-authorization"))
            length = int(lowered.get("content-length", "0"))
            while len(body) < length:
                chunk = client.recv(65536)
                if not chunk:
                    return
                body += chunk
            url = urlsplit(target)
            if url.scheme != "http" or url.hostname is None:
                client.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                return
            path = url.path + (f"?{url.query}" if url.query else "")
            kept = [
                f"{k.strip()}: {v.strip()}"
                for k, v in headers
                if k.strip().lower() not in ("connection", "proxy-authorization", "keep-alive")
            ]
            request = "\r\n".join([f"{method} {path} {version}", *kept, "connection: close"])
            with socket.create_connection((url.hostname, url.port or 80)) as upstream:
                upstream.sendall(request.encode("latin-1") + b"\r\n\r\n" + body)
                self._relay(upstream, client)

    @staticmethod
    def _relay(upstream: socket.socket, client: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = upstream.recv(65536)
            if not chunk:
                return
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        status, *header_lines = head.split(b"\r\n")
        kept = [h for h in header_lines if not h.lower().startswith(b"connection:")]
        client.sendall(b"\r\n".join([status, *kept, b"connection: close"]) + b"\r\n\r\n" + rest)
        while chunk := upstream.recv(65536):
            client.sendall(chunk)

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as server:
        server.models = [FakeModel("m1")]
        yield server


@pytest.fixture
def proxy() -> Iterator[ForwardingProxy]:
    server = ForwardingProxy()
    try:
        yield server
    finally:
        server.close()


def _credentialed(proxy: ForwardingProxy) -> str:
    return f"http://magi:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"


# Both modes: the environment is the process's (embedded) or the shim's launch context.
@pytest.mark.both_modes
async def test_launch_environment_proxy_carries_turns_and_refresh(
    home: Path, project: Path, fake: FakeProviderServer, proxy: ForwardingProxy
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["via ", "proxy"]))
    env = {"HTTPS_PROXY": _credentialed(proxy), "HTTP_PROXY": _credentialed(proxy)}
    async with running_service(home, project, env) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.terminal["status"] == "completed"
        assert turn.text == "via proxy"
        refreshed = await service.request("catalog.refresh", {"provider_id": "local"})
        assert refreshed["payload"] == {"provider_id": "local", "state": "fresh_cache"}
        await service.close_stdin()
        stderr = await service.stderr_text()
    assert proxy.lines == [
        f"POST {fake.base_url}/v1/chat/completions HTTP/1.1",
        f"GET {fake.base_url}/v1/models HTTP/1.1",
    ]
    assert all(value and value.startswith("Basic ") for value in proxy.authorization)
    assert [r.path for r in fake.requests] == ["/v1/chat/completions", "/v1/models"]
    # Proxy credentials appear in no log.
    assert PROXY_PASSWORD not in stderr
    log = home / "run" / "daemon.log"
    assert not log.exists() or PROXY_PASSWORD not in log.read_text()


# Both modes: the environment is the process's (embedded) or the shim's launch context.
@pytest.mark.both_modes
async def test_lower_case_variable_and_no_proxy_bypass(
    home: Path, project: Path, fake: FakeProviderServer, proxy: ForwardingProxy
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["direct"]), Reply(text=["proxied"]))
    bypass = {"http_proxy": proxy.url, "NO_PROXY": "127.0.0.1"}
    async with running_service(home, project, bypass) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.text == "direct"
    assert proxy.lines == []
    async with running_service(home, project, {"http_proxy": proxy.url}) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.text == "proxied"
    assert proxy.lines == [f"POST {fake.base_url}/v1/chat/completions HTTP/1.1"]


async def one_turn_with_a_project_proxy(
    home: Path, project: Path, fake: FakeProviderServer, proxy: ForwardingProxy
) -> None:
    fake.enqueue(Reply(text=["ok"]))
    (project / ".magi-code").mkdir()
    (project / ".magi-code" / "settings.json").write_text(
        json.dumps({"network": {"proxy": proxy.url}})
    )
    async with running_service(home, project) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.terminal["status"] == "completed"


async def test_an_untrusted_projects_network_proxy_is_ignored(
    home: Path, project: Path, fake: FakeProviderServer, proxy: ForwardingProxy
) -> None:
    # A cloned repository must not route provider traffic (and its key) through a proxy.
    write_settings(home, fake)
    await one_turn_with_a_project_proxy(home, project, fake, proxy)
    assert proxy.lines == []
    assert len(fake.requests) == 1


async def test_settings_network_proxy_trusted_project_over_global(
    home: Path, project: Path, fake: FakeProviderServer, proxy: ForwardingProxy
) -> None:
    # The global entry names a proxy nobody listens on; the trusted project's entry wins.
    write_settings(
        home, fake, network={"proxy": "http://127.0.0.1:9"}, trusted_projects=[str(project)]
    )
    await one_turn_with_a_project_proxy(home, project, fake, proxy)
    assert proxy.lines == [f"POST {fake.base_url}/v1/chat/completions HTTP/1.1"]
    # The environment's NO_PROXY still applies to the settings proxy.
    fake.enqueue(Reply(text=["ok"]))
    async with running_service(home, project, {"NO_PROXY": "127.0.0.1"}) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.terminal["status"] == "completed"
    assert len(proxy.lines) == 1


# Both modes: the environment is the process's (embedded) or the shim's launch context.
@pytest.mark.both_modes
async def test_an_unreachable_proxy_fails_the_turn_instead_of_going_direct(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["never"]))
    # The proxy refuses each connection at once: the retries' backoff is shortened.
    unreachable = {"HTTP_PROXY": "http://127.0.0.1:9", "MC_RETRY_BASE_SECONDS": "0.01"}
    async with running_service(home, project, unreachable) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.terminal["status"] == "failed"
        refreshed = await service.request("catalog.refresh", {"provider_id": "local"})
        assert refreshed["error"]["code"] == "catalog_refresh_failed"
    assert fake.requests == []
