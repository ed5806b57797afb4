"""The HTTP client cache: keys (origin, credential identity, proxy/CA options), LRU
eviction that closes clients only when their last lease ends, and proxy/CA options built
from a launch environment with httpx's own NO_PROXY and URL-pattern semantics."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from provider_helpers import FAST_RETRY, make_request

from magi_code.providers import Endpoint, stream_response
from magi_code.providers.errors import FailureLabel, ProviderFailure
from magi_code.providers.http import (
    DIRECT,
    BoundClients,
    HttpClients,
    NetworkSettings,
    TransportOptions,
    build_client,
    bundled_ssl_context,
    environment_proxies,
    origin,
    ssl_context,
    transport_options,
)

SECRET = "sk-live-secret-value-0000"
PROXY_PASSWORD = "proxy-pass-word-0000"


def _options(**env: str) -> TransportOptions:
    return transport_options(env)


class _Built:
    """A build function that records what it built (real clients, no network)."""

    def __init__(self) -> None:
        self.clients: list[httpx.AsyncClient] = []

    def __call__(self, options: TransportOptions) -> httpx.AsyncClient:
        client = httpx.AsyncClient(trust_env=False)
        self.clients.append(client)
        return client


# -- options from the launch environment ---------------------------------------------------


def test_proxy_variables_any_case_lower_case_wins_and_empty_lower_case_unsets() -> None:
    assert environment_proxies({"HTTPS_PROXY": "http://a:1", "https_proxy": "http://b:2"}) == {
        "https": "http://b:2"
    }
    assert environment_proxies({"HTTP_PROXY": "http://a:1", "http_proxy": ""}) == {}
    assert environment_proxies({"ALL_PROXY": "c:3", "NO_PROXY": "x"}) == {"all": "c:3", "no": "x"}
    # httpoxy: a CGI server's upper-case HTTP_PROXY comes from a request header.
    assert environment_proxies({"HTTP_PROXY": "http://a:1", "REQUEST_METHOD": "GET"}) == {}


def test_environment_proxies_become_httpx_mount_patterns() -> None:
    options = _options(
        HTTPS_PROXY="http://secure:1",
        http_proxy="plain:2",
        ALL_PROXY="http://every:3",
        NO_PROXY="127.0.0.1, localhost,.corp.example,::1,internal,https://direct.example",
    )
    assert dict(options.proxies) == {
        "https://": "http://secure:1",
        "http://": "http://plain:2",  # a bare host:port is an http:// proxy, as in httpx
        "all://": "http://every:3",
        "all://127.0.0.1": None,
        "all://localhost": None,
        "all://*.corp.example": None,
        "all://[::1]": None,
        "all://*internal": None,
        "https://direct.example": None,
    }
    assert _options(HTTPS_PROXY="http://p:1", NO_PROXY="a, *").proxies == ()
    assert _options(NO_PROXY="127.0.0.1").proxies == ()  # nothing to bypass


@pytest.mark.parametrize(
    "no_proxy",
    [
        "",
        "127.0.0.1, localhost,.corp.example,::1,internal,https://direct.example",
        "192.168.0.0/16,LOCALHOST, ,example.com",
        "a,*",
    ],
)
def test_mount_patterns_are_exactly_what_httpx_builds_from_the_same_environment(
    no_proxy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from httpx._utils import get_environment_proxies  # httpx's own reading, of os.environ

    env = {"HTTPS_PROXY": "http://s:1", "http_proxy": "p:2", "ALL_PROXY": "http://a:3"}
    env["NO_PROXY"] = no_proxy
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "REQUEST_METHOD":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert dict(_options(**env).proxies) == get_environment_proxies()


def test_a_no_proxy_entry_httpx_cannot_parse_is_dropped_not_fatal() -> None:
    options = _options(HTTPS_PROXY="http://p:1", NO_PROXY="fe80::/10,10.0.0.1")
    assert dict(options.proxies) == {"https://": "http://p:1", "all://10.0.0.1": None}
    assert isinstance(build_client(options), httpx.AsyncClient)


def test_settings_proxy_replaces_the_environment_proxies_but_no_proxy_still_applies() -> None:
    env = {"HTTPS_PROXY": "http://env:1", "NO_PROXY": "127.0.0.1"}
    options = transport_options(env, NetworkSettings(proxy="http://settings:2"))
    assert dict(options.proxies) == {"all://": "http://settings:2", "all://127.0.0.1": None}


def test_ca_source_precedence(tmp_path: Path) -> None:
    env = {"SSL_CERT_FILE": "/env/file.pem", "SSL_CERT_DIR": "/env/dir"}
    chosen = transport_options(env, NetworkSettings(ca_file="/settings/ca.pem"))
    assert (chosen.ca_file, chosen.ca_dir) == ("/settings/ca.pem", None)
    assert (_options(**env).ca_file, _options(**env).ca_dir) == ("/env/file.pem", None)
    only_dir = _options(SSL_CERT_DIR="/env/dir")
    assert (only_dir.ca_file, only_dir.ca_dir) == (None, "/env/dir")
    assert _options() == TransportOptions()


def test_this_process_environment_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://process-own:1")
    monkeypatch.setenv("SSL_CERT_FILE", "/process/own.pem")
    assert transport_options({}) == TransportOptions()


def test_options_repr_never_shows_proxy_urls() -> None:
    options = _options(HTTPS_PROXY=f"http://user:{PROXY_PASSWORD}@proxy:1")
    assert PROXY_PASSWORD not in repr(options)
    pool = HttpClients()
    key = pool.key("https://api.example/v1", {"authorization": f"Bearer {SECRET}"}, options)
    assert PROXY_PASSWORD not in repr(key) and SECRET not in repr(key)


def test_unusable_proxy_or_ca_fails_closed_without_details(tmp_path: Path) -> None:
    for options in (
        _options(HTTPS_PROXY=f"ftp://user:{PROXY_PASSWORD}@proxy:1"),
        transport_options({}, NetworkSettings(ca_file=str(tmp_path / "missing.pem"))),
        _options(SSL_CERT_FILE=str(tmp_path / "missing.pem")),
    ):
        with pytest.raises(ProviderFailure) as failure:
            build_client(options)
        assert failure.value.label is FailureLabel.HTTP_ERROR
        assert PROXY_PASSWORD not in repr(failure.value)
        assert failure.value.__cause__ is None and failure.value.__suppress_context__


def test_a_ca_file_from_settings_is_loaded(tmp_path: Path) -> None:
    import certifi

    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    client = build_client(transport_options({}, NetworkSettings(ca_file=str(bundle))))
    assert isinstance(client, httpx.AsyncClient)


def test_the_bundled_roots_are_loaded_once_and_a_ca_file_every_time(tmp_path: Path) -> None:
    import certifi

    assert ssl_context(DIRECT) is ssl_context(DIRECT) is bundled_ssl_context()
    assert ssl_context(DIRECT).get_ca_certs()
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    options = transport_options({}, NetworkSettings(ca_file=str(bundle)))
    assert ssl_context(options) is not ssl_context(options)


# -- keys ----------------------------------------------------------------------------------


def test_origin_normalizes_scheme_host_and_default_ports() -> None:
    assert origin("HTTPS://API.Example.com/v1/models?x=1") == "https://api.example.com:443"
    assert origin("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080"
    assert origin("http://[::1]/v1") == "http://[::1]:80"


def test_keys_separate_origins_credentials_and_options_only() -> None:
    pool = HttpClients()
    direct = TransportOptions()
    proxied = _options(HTTPS_PROXY="http://proxy:1")
    key = pool.key("https://api.example/v1", {"x-api-key": SECRET}, direct)
    assert key == pool.key("https://api.example/v1/models", {"X-Api-Key": SECRET}, direct)
    assert key != pool.key("https://api.example:8443/v1", {"x-api-key": SECRET}, direct)
    assert key != pool.key("https://other.example/v1", {"x-api-key": SECRET}, direct)
    assert key != pool.key("https://api.example/v1", {"x-api-key": SECRET + "1"}, direct)
    assert key != pool.key("https://api.example/v1", {"x-api-key": SECRET}, proxied)
    assert key != pool.key("https://api.example/v1", {}, direct)
    assert SECRET not in key.credential


def test_an_account_id_is_the_identity_across_token_rotation() -> None:
    pool = HttpClients()
    first = {"Authorization": "Bearer token-1", "ChatGPT-Account-ID": "acct-1"}
    rotated = {"Authorization": "Bearer token-2", "ChatGPT-Account-ID": "acct-1"}
    other = {"Authorization": "Bearer token-1", "ChatGPT-Account-ID": "acct-2"}
    url = "https://chatgpt.example/backend-api/codex"
    assert pool.key(url, first, DIRECT) == pool.key(url, rotated, DIRECT)
    assert pool.key(url, first, DIRECT) != pool.key(url, other, DIRECT)


def test_identities_are_keyed_per_cache() -> None:
    # A digest of a key cannot be matched against another process's (or a table's).
    headers = {"x-api-key": SECRET}
    assert HttpClients().credential_identity(headers) != HttpClients().credential_identity(headers)


# -- leases and eviction ---------------------------------------------------------------------


async def test_same_key_reuses_one_client_and_different_keys_do_not() -> None:
    built = _Built()
    pool = HttpClients(capacity=4, build=built)
    async with (
        pool.lease("https://a.example/v1", {"x-api-key": "k1"}, DIRECT) as one,
        pool.lease("https://a.example/v2", {"x-api-key": "k1"}, DIRECT) as two,
    ):
        assert one is two
    async with pool.lease("https://a.example/v1", {"x-api-key": "k2"}, DIRECT) as other:
        assert other is not one
    async with pool.lease("https://a.example/v1", {"x-api-key": "k1"}, _proxy()) as proxied:
        assert proxied is not one
    assert len(built.clients) == 3 and len(pool) == 3
    await pool.aclose()
    assert all(client.is_closed for client in built.clients)


def _proxy() -> TransportOptions:
    return _options(HTTPS_PROXY="http://proxy:1")


async def test_least_recently_used_is_evicted_and_closed() -> None:
    built = _Built()
    pool = HttpClients(capacity=2, build=built)
    for name in ("a", "b"):
        async with pool.lease(f"https://{name}.example", {}, DIRECT):
            pass
    async with pool.lease("https://a.example", {}, DIRECT):  # a is now most recent
        pass
    async with pool.lease("https://c.example", {}, DIRECT):
        pass
    await asyncio.sleep(0.05)
    a, b, c = built.clients
    assert b.is_closed and not a.is_closed and not c.is_closed
    assert [k.origin for k in pool.cached()] == ["https://a.example:443", "https://c.example:443"]
    await pool.aclose()


async def test_an_evicted_client_in_use_closes_when_its_last_lease_ends() -> None:
    built = _Built()
    pool = HttpClients(capacity=1, build=built)
    async with pool.lease("https://busy.example", {}, DIRECT) as busy:
        async with pool.lease("https://next.example", {}, DIRECT):
            pass
        await asyncio.sleep(0.05)
        assert not busy.is_closed  # a running turn keeps its client
        assert len(pool) == 1
    await asyncio.sleep(0.05)
    assert busy.is_closed
    # A new lease for the evicted key builds a fresh client.
    async with pool.lease("https://busy.example", {}, DIRECT) as again:
        assert again is not busy
    await pool.aclose()


async def test_concurrent_first_leases_share_one_client() -> None:
    built = _Built()
    pool = HttpClients(build=built)

    async def lease() -> httpx.AsyncClient:
        async with pool.lease("https://a.example", {}, DIRECT) as client:
            await asyncio.sleep(0.01)
            return client

    first, second = await asyncio.gather(lease(), lease())
    assert first is second and len(pool) == 1
    await asyncio.sleep(0.05)
    assert sum(1 for client in built.clients if client.is_closed) == len(built.clients) - 1
    await pool.aclose()


async def test_a_failed_build_caches_nothing() -> None:
    pool = HttpClients()
    with pytest.raises(ProviderFailure):
        async with pool.lease("https://a.example", {}, _options(HTTPS_PROXY="ftp://p:1")):
            pass
    assert len(pool) == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HttpClients(capacity=0)


# -- routing through real clients ----------------------------------------------------------


class _Answering:
    """A loopback HTTP server answering every request with its own name (as a proxy would
    for an absolute-form request); records request lines."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head = data.split(b"\r\n\r\n", 1)[0].decode()
                line, *rest = head.split("\r\n")
                self.lines.append(line)
                self.headers.append(
                    {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in rest)}
                )
                body = self.name.encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def servers() -> Iterator[tuple[_Answering, _Answering]]:
    proxy, target = _Answering("proxied"), _Answering("direct")
    try:
        yield proxy, target
    finally:
        proxy.close()
        target.close()


async def _get(source: BoundClients, url: str) -> str:
    async with source.lease(url, {}) as client:
        return (await client.get(url)).text


async def test_requests_follow_the_launch_environment_proxy_and_no_proxy(
    servers: tuple[_Answering, _Answering], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, target = servers
    # The process's own variables must not matter (the daemon's are not the frontend's).
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    pool = HttpClients()
    url = f"http://127.0.0.1:{target.port}/v1/models"
    proxy_url = f"http://user:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
    env = {"HTTP_PROXY": proxy_url}
    assert await _get(pool.bound(transport_options(env)), url) == "proxied"
    assert proxy.lines == [f"GET {url} HTTP/1.1"]
    assert proxy.headers[0]["proxy-authorization"].startswith("Basic ")
    bypass = {**env, "NO_PROXY": "127.0.0.1"}
    assert await _get(pool.bound(transport_options(bypass)), url) == "direct"
    settings = NetworkSettings(proxy=f"http://127.0.0.1:{proxy.port}")
    assert await _get(pool.bound(transport_options({}, settings)), url) == "proxied"
    assert await _get(pool.bound(transport_options({})), url) == "direct"
    assert len(proxy.lines) == 2 and len(target.lines) == 2
    await pool.aclose()


async def test_a_model_request_follows_the_proxy_too(
    servers: tuple[_Answering, _Answering],
) -> None:
    """A model request takes the client's proxy route, as any other request does."""
    proxy, target = servers
    url = f"http://127.0.0.1:{target.port}/v1"
    endpoint = Endpoint("openai-chat", url, {"Authorization": "Bearer k"})
    proxied = transport_options({"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}"})
    async with build_client(proxied) as client:
        with pytest.raises(ProviderFailure):  # a plain text answer is no event stream
            async for _ in stream_response(client, endpoint, make_request(), FAST_RETRY):
                pass
    assert proxy.lines == [f"POST {url}/chat/completions HTTP/1.1"]
    assert target.lines == []
