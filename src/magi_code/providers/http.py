"""HTTP clients per endpoint, credential and network settings (runtime layer).

Theory of operation: a service talks to many provider endpoints for many frontends,
each with its own credentials and its own proxy/CA environment. One shared
``httpx.AsyncClient`` would mix their connection pools and cookie jars, and could only
honour one proxy set-up. So every request leases a client from :class:`HttpClients`, a
small LRU cache keyed by

- the request URL's origin (scheme, host, port),
- the credential identity: a keyed digest (random per cache, never logged) of the
  request's auth headers, or of the account ID when one is present (it survives token
  rotation), and
- the :class:`TransportOptions`: the proxy routing and CA source, built from the
  frontend's launch environment (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``/
  ``NO_PROXY``, lower-case too, ``SSL_CERT_FILE``/``SSL_CERT_DIR``) and the settings'
  ``network`` entry, never from this process's ``os.environ``.

Clients are httpx's own, with httpx's transport (httpcore's connection pool) on every
route, built with ``trust_env=False``, explicit ``mounts=`` (one proxy transport per httpx
URL pattern, ``None`` = direct, with httpx's own pattern matching and priority) and
``verify=`` (one SSL context for every route). Their cookie jar stores nothing: a
provider's cookies are never kept or sent back. A client evicted from the cache is closed
as soon as its last lease ends. A proxy URL httpx cannot use or a CA file that cannot be
loaded fails the request (``ProviderFailure``); it never falls back to a direct
connection or to the default CAs. Nothing here logs a URL, a header or a proxy.

httpx is imported by the functions that use it, here and in every product module, never
at module level: loading it (~35 ms) is left out of the daemon's start, which imports the
whole product before it answers; the daemon loads it just after (``turns.runtime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import ipaddress
import secrets
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Final, Protocol

from magi_code.dataclass import dataclass, field
from magi_code.providers.errors import FailureLabel, ProviderFailure

if TYPE_CHECKING:
    from http.cookiejar import CookieJar

    import httpx

DEFAULT_CAPACITY: Final = 16
# Headers whose values identify a credential (lower-case). An account ID, when present,
# is the identity on its own: the access token rotates, the account does not.
ACCOUNT_HEADERS: Final = ("chatgpt-account-id",)
PROXY_SCHEMES: Final = ("http", "https", "socks5", "socks5h")
# Each route's connection pool, pinned here (as documented) rather than left to httpx's
# defaults, which are the same today: at most this many connections open, this many kept
# idle, an idle one closed after this long.
MAX_CONNECTIONS: Final = 100
MAX_IDLE_CONNECTIONS: Final = 20
IDLE_CONNECTION_SECONDS: Final = 5.0
_SCHEMES: Final = ("http", "https", "all")


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """The settings file's ``network`` entry (project over global), already merged."""

    proxy: str | None = None
    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """Everything a client's transports depend on; hashable, part of the cache key.

    ``proxies`` are httpx mount patterns (``"https://"``, ``"all://*example.com"``) with
    the proxy URL to use, or ``None`` for a direct connection. ``repr`` never shows them:
    proxy URLs may hold credentials.
    """

    proxies: tuple[tuple[str, str | None], ...] = ()
    ca_file: str | None = None
    ca_dir: str | None = None

    def __repr__(self) -> str:
        routes = sum(1 for _, url in self.proxies if url is not None)
        return f"TransportOptions(<{routes} proxy routes>, ca={self.ca_file is not None})"


DIRECT: Final = TransportOptions()


def environment_proxies(env: Mapping[str, str]) -> dict[str, str]:
    """``{"http"|"https"|"all"|"no"|...: value}`` from ``*_proxy`` variables.

    As ``urllib.request.getproxies_environment`` does, but over ``env``: any case first,
    then lower-case names win (an empty lower-case one unsets), and an upper-case
    ``HTTP_PROXY`` is ignored when ``REQUEST_METHOD`` says a CGI server set it.
    """
    proxies: dict[str, str] = {}
    for name, value in env.items():
        lower = name.lower()
        if value and lower.endswith("_proxy"):
            proxies[lower[:-6]] = value
    if "REQUEST_METHOD" in env:
        proxies.pop("http", None)
    for name, value in env.items():
        if name.endswith("_proxy"):
            if value:
                proxies[name[:-6]] = value
            else:
                proxies.pop(name[:-6], None)
    return proxies


def _is_ip(host: str, version: int) -> bool:
    # As httpx's is_ipv4_hostname/is_ipv6_hostname: a "/prefix" suffix is ignored.
    try:
        return ipaddress.ip_address(host.split("/")[0]).version == version
    except ValueError:
        return False


def _no_proxy_patterns(no_proxy: str) -> dict[str, None] | None:
    """httpx's reading of ``NO_PROXY``; ``None`` means ``*`` (never use a proxy)."""
    patterns: dict[str, None] = {}
    for raw in no_proxy.split(","):
        host = raw.strip()
        if host == "*":
            return None
        if not host:
            continue
        # Same forms as httpx's get_environment_proxies (curl's CURLOPT_NOPROXY).
        if "://" in host:
            patterns[host] = None
        elif _is_ip(host, 4) or host.lower() == "localhost":
            patterns[f"all://{host}"] = None
        elif _is_ip(host, 6):
            patterns[f"all://[{host}]"] = None
        else:
            patterns[f"all://*{host}"] = None
    # An entry httpx cannot parse as a pattern (an IPv6 prefix, say) matches nothing; it
    # is dropped rather than failing every request (httpx itself would refuse the client).
    return {pattern: None for pattern in patterns if _parses(pattern)}


def _parses(pattern: str) -> bool:
    import httpx

    try:
        httpx.URL(pattern)
    except (httpx.InvalidURL, ValueError, TypeError):
        return False
    return True


def _proxy_url(value: str) -> str:
    return value if "://" in value else f"http://{value}"


def transport_options(
    env: Mapping[str, str], network: NetworkSettings | None = None
) -> TransportOptions:
    """The proxy routing and CA source for one frontend's requests.

    - Proxy: ``network.proxy`` for every scheme when set, else the environment's
      ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``; the environment's ``NO_PROXY`` applies
      to both (``*`` turns proxies off).
    - CA: ``network.ca_file``, else ``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else the
      bundled (certifi) roots.
    """
    network = network or NetworkSettings()
    found = environment_proxies(env)
    mounts: dict[str, str | None] = {}
    if network.proxy:
        mounts["all://"] = _proxy_url(network.proxy)
    else:
        for scheme in _SCHEMES:
            value = found.get(scheme)
            if value:
                mounts[f"{scheme}://"] = _proxy_url(value)
    bypass = _no_proxy_patterns(found.get("no", ""))
    if bypass is None:
        mounts = {}
    elif mounts:
        mounts.update(bypass)
    ca_file = network.ca_file or env.get("SSL_CERT_FILE") or None
    ca_dir = None if ca_file else env.get("SSL_CERT_DIR") or None
    return TransportOptions(tuple(sorted(mounts.items())), ca_file, ca_dir)


def ssl_context(options: TransportOptions) -> ssl.SSLContext:
    """Blocking (reads certificate files).

    Raises:
        OSError, ssl.SSLError: the CA file or directory cannot be loaded.
    """
    if options.ca_file is not None:
        return ssl.create_default_context(cafile=options.ca_file)
    if options.ca_dir is not None:
        return ssl.create_default_context(capath=options.ca_dir)
    return bundled_ssl_context()


@functools.cache
def bundled_ssl_context() -> ssl.SSLContext:
    """The context with the bundled (certifi) roots, built once and shared by every
    client that uses them: loading the bundle takes ~20 ms, and no client changes its
    context (``http2=False``: every connection sets the same ALPN protocols).

    Blocking; raises as :func:`ssl_context` (a failure is not cached).
    """
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def warm_bundled_roots() -> None:
    """:func:`bundled_ssl_context` ahead of a first client (run it in a worker thread:
    mostly outside the GIL); never raises. A failure is not cached: the client that needs
    the roots tries again and fails as it would have."""
    with contextlib.suppress(OSError, ImportError):
        bundled_ssl_context()


def build_client(options: TransportOptions) -> httpx.AsyncClient:
    """A client for these options; blocking (run it in a thread).

    Raises:
        ProviderFailure: ``provider_http_error`` for an unusable proxy URL or CA source.
    """
    import httpx

    try:
        for _, url in options.proxies:
            if url is not None and httpx.URL(url).scheme not in PROXY_SCHEMES:
                raise ValueError("unsupported proxy scheme")
        verify = ssl_context(options)
        limits = httpx.Limits(
            max_connections=MAX_CONNECTIONS,
            max_keepalive_connections=MAX_IDLE_CONNECTIONS,
            keepalive_expiry=IDLE_CONNECTION_SECONDS,
        )
        mounts: dict[str, httpx.AsyncBaseTransport | None] = {
            pattern: None
            if url is None
            else httpx.AsyncHTTPTransport(proxy=url, verify=verify, limits=limits)
            for pattern, url in options.proxies
        }
        return httpx.AsyncClient(
            http2=False,
            trust_env=False,
            verify=verify,
            mounts=mounts,
            limits=limits,
            cookies=_no_cookies(),
        )
    # Deliberately unchained: a proxy URL (with its credentials) or a path must not show.
    except (ValueError, TypeError, ImportError, OSError, httpx.InvalidURL):
        raise ProviderFailure(FailureLabel.HTTP_ERROR) from None


def _no_cookies() -> CookieJar:
    """A jar that stores nothing (no domain is allowed), so it never sends anything back."""
    import http.cookiejar

    return http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (lower-case, default ports filled in).

    Raises:
        ProviderFailure: ``provider_http_error`` for a URL httpx cannot parse.
    """
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ProviderFailure(FailureLabel.HTTP_ERROR) from None
    port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme, 0)
    host = parsed.host.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{parsed.scheme.lower()}://{host}:{port}"


@dataclass(frozen=True, slots=True)
class ClientKey:
    origin: str
    credential: str
    options: TransportOptions = field(repr=False)


class ClientSource(Protocol):
    """Where a request gets its client: ``async with source.lease(url, headers)``."""

    def lease(
        self, url: str, credential: Mapping[str, str]
    ) -> AbstractAsyncContextManager[httpx.AsyncClient]: ...


class FixedClient:
    """One caller-owned client for every lease (tests, one-off tools); never closed here."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    @contextlib.asynccontextmanager
    async def lease(
        self, url: str, credential: Mapping[str, str]
    ) -> AsyncIterator[httpx.AsyncClient]:
        yield self.client


def as_source(client: httpx.AsyncClient | ClientSource) -> ClientSource:
    import httpx

    return FixedClient(client) if isinstance(client, httpx.AsyncClient) else client


@dataclass(eq=False, slots=True)
class _Entry:
    client: httpx.AsyncClient
    leases: int = 0
    evicted: bool = False


class HttpClients:
    """The bounded client cache shared by a service's turns, catalog and OAuth calls."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        build: Callable[[TransportOptions], httpx.AsyncClient] = build_client,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._build = build
        self._entries: OrderedDict[ClientKey, _Entry] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        # Keyed digests: an identity cannot be matched against a known key offline.
        self._salt = secrets.token_bytes(32)

    def __len__(self) -> int:
        return len(self._entries)

    def cached(self) -> list[ClientKey]:
        """Cached keys, least recently used first."""
        return list(self._entries)

    def credential_identity(self, credential: Mapping[str, str]) -> str:
        lowered = {k.lower(): v for k, v in credential.items()}
        accounts = {k: lowered[k] for k in ACCOUNT_HEADERS if lowered.get(k)}
        material = sorted((accounts or lowered).items())
        if not material:
            return "anonymous"
        data = "\n".join(f"{k}\0{v}" for k, v in material).encode()
        return hmac.new(self._salt, data, hashlib.sha256).hexdigest()[:32]

    def key(self, url: str, credential: Mapping[str, str], options: TransportOptions) -> ClientKey:
        return ClientKey(origin(url), self.credential_identity(credential), options)

    def bound(self, options: TransportOptions) -> BoundClients:
        """A :class:`ClientSource` for one frontend's network options."""
        return BoundClients(self, options)

    @contextlib.asynccontextmanager
    async def lease(
        self, url: str, credential: Mapping[str, str], options: TransportOptions
    ) -> AsyncIterator[httpx.AsyncClient]:
        """The cached client for this key (built on first use) for the ``with`` body.

        Raises:
            ProviderFailure: ``provider_http_error`` when no client can be built.
        """
        key = self.key(url, credential, options)
        entry = self._entries.get(key)
        if entry is None:
            client = await asyncio.to_thread(self._build, options)
            entry = self._entries.get(key)  # another lease may have built one meanwhile
            if entry is None:
                entry = _Entry(client)
                self._entries[key] = entry
                self._evict()
            else:
                self._close_later(client)
        self._entries.move_to_end(key)
        entry.leases += 1
        try:
            yield entry.client
        finally:
            entry.leases -= 1
            if entry.evicted and entry.leases == 0:
                self._close_later(entry.client)

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            _, entry = self._entries.popitem(last=False)
            entry.evicted = True
            if entry.leases == 0:
                self._close_later(entry.client)

    def _close_later(self, client: httpx.AsyncClient) -> None:
        task = asyncio.get_running_loop().create_task(client.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every cached client (leases still open keep theirs until they end)."""
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            entry.evicted = True
            if entry.leases == 0:
                self._close_later(entry.client)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


class BoundClients:
    """:class:`HttpClients` with one frontend's :class:`TransportOptions` applied."""

    def __init__(self, clients: HttpClients, options: TransportOptions) -> None:
        self.clients = clients
        self.options = options

    def lease(
        self, url: str, credential: Mapping[str, str]
    ) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        return self.clients.lease(url, credential, self.options)
