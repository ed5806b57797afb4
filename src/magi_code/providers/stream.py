"""Streaming one model response over httpx, with bounded retries before the first event.

Theory of operation: ``stream_response`` builds the API's request once, then for each
attempt opens ``client.stream(...)`` *inside* the async generator, so closing the
generator (``aclose()``, ``break`` under ``contextlib.aclosing``, task cancellation)
exits the ``async with`` and closes the HTTP response and its connection.

- Retries: 408/409/429/5xx statuses and connect-phase errors, only while no event has
  been yielded; at most ``RetryPolicy.max_retries`` retries, exponential backoff with
  jitter (:func:`stream_settings` reads its base from the launch environment),
  ``retry-after-ms`` / ``retry-after`` honoured up to ``max_retry_after``.
  Quota errors (429 ``insufficient_quota``/``usage_limit_reached``) are not retried.
- Timeouts: ``connect_timeout`` to connect; ``idle_timeout`` bounds each read, i.e. the
  gap between chunks (SSE comments/pings count as activity).
- Completion: the wire decoder says when the API's terminal event arrived; EOF before
  it is ``provider_stream_error``. What follows the terminal event (normally only the end
  of the body) is read before the terminal event is yielded, briefly and boundedly, so
  the connection goes back to the pool for the next request instead of being closed: an
  HTTP/1.1 response closed before its end takes its connection with it, and the next
  request would pay a new TCP and TLS handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import orjson

from magi_code.dataclass import dataclass, field
from magi_code.durations import seconds_from
from magi_code.providers.apis import API_PROFILES
from magi_code.providers.errors import (
    ProviderFailure,
    error_kind,
    failure_for_status,
    map_httpx_errors,
)
from magi_code.providers.sse import SSEEvent, SSEParser
from magi_code.providers.types import Endpoint, ProviderRequest, StreamEvent
from magi_code.providers.wire import Decoder, HttpCall

if TYPE_CHECKING:
    import httpx

MAX_ERROR_BODY_BYTES: Final = 64 * 1024
# Reading the rest of a response after its terminal event: a server that keeps sending
# past these loses the connection instead.
MAX_TRAILING_BYTES: Final = 64 * 1024
TRAILING_SECONDS: Final = 0.25


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 10.0

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        backoff = min(self.base_delay * (2.0**retry), self.max_delay)
        return backoff * random.uniform(0.75, 1.0)


@dataclass(frozen=True, slots=True)
class StreamSettings:
    connect_timeout: float = 10.0
    idle_timeout: float = 120.0
    write_timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def timeout(self) -> httpx.Timeout:
        import httpx

        return httpx.Timeout(
            connect=self.connect_timeout,
            read=self.idle_timeout,
            write=self.write_timeout,
            pool=self.connect_timeout,
        )


DEFAULT_SETTINGS: Final = StreamSettings()
RETRY_BASE_ENV: Final = "MC_RETRY_BASE_SECONDS"


def stream_settings(env: Mapping[str, str]) -> StreamSettings:
    """The defaults, with the first retry's backoff from ``MC_RETRY_BASE_SECONDS`` in the
    launch environment (a positive number of seconds; each later retry doubles it)."""
    base = seconds_from(env, RETRY_BASE_ENV, DEFAULT_SETTINGS.retry.base_delay)
    if base == DEFAULT_SETTINGS.retry.base_delay:
        return DEFAULT_SETTINGS
    retry = dataclasses.replace(DEFAULT_SETTINGS.retry, base_delay=base)
    return dataclasses.replace(DEFAULT_SETTINGS, retry=retry)


def build_call(endpoint: Endpoint, request: ProviderRequest) -> HttpCall:
    """The exact HTTP request ``stream_response`` sends (URL, headers, JSON body; with a
    message cache its messages are already encoded, an ``EncodedArray``)."""
    return API_PROFILES[endpoint.api].build_call(endpoint, request)


async def stream_response(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    request: ProviderRequest,
    settings: StreamSettings = DEFAULT_SETTINGS,
) -> AsyncGenerator[StreamEvent, None]:
    """Stream one model response as neutral events, ending with ``Completed``.

    Raises:
        ProviderFailure: any failure, labelled; never carries provider text.
    """
    wire = API_PROFILES[endpoint.api]
    call = wire.build_call(endpoint, request)
    content = call.content()
    length = str(sum(len(chunk) for chunk in content))
    retries = 0
    while True:
        yielded = False
        try:
            with map_httpx_errors():
                async with client.stream(
                    "POST",
                    call.url,
                    content=_once(content),
                    headers={**call.headers, "content-length": length},
                    timeout=settings.timeout(),
                ) as response:
                    if not response.is_success:
                        raise await _status_failure(response)
                    decoder = wire.decoder()
                    parser = SSEParser()
                    chunks = response.aiter_bytes()
                    async for chunk in chunks:
                        events, failure = _decode(decoder, parser.feed(chunk))
                        if decoder.done:
                            await _read_trailing(chunks)
                        for event in events:
                            yielded = True
                            yield event
                        if failure is not None:
                            raise failure
                        if decoder.done:
                            return  # terminal event: the response is over
                    events, failure = _decode(decoder, parser.close())
                    for event in events:
                        yielded = True
                        yield event
                    if failure is not None:
                        raise failure
                    for event in decoder.finish():
                        yielded = True
                        yield event
                    return
        except ProviderFailure as failure:
            if yielded or not failure.retryable or retries >= settings.retry.max_retries:
                failure.retries = retries
                raise
            delay = settings.retry.delay(retries, failure.retry_after)
        retries += 1
        await asyncio.sleep(delay)


async def _once(content: list[bytes]) -> AsyncIterator[bytes]:
    """The body's chunks, given to httpx to send and then let go: each response sits in a
    reference cycle of httpx's own until the cycle collector runs, and with
    ``content=body`` the cycle would keep the request body (as large as the conversation)
    alive with it. With an explicit content-length httpx sends it as is, not chunked."""
    for chunk in content:
        yield chunk


async def _read_trailing(chunks: AsyncIterator[bytes]) -> None:
    """Read the body past the terminal event, so the connection can be reused; a failure
    or a server that goes on only costs the connection."""
    import httpx

    read = 0
    with contextlib.suppress(httpx.HTTPError, TimeoutError):
        async with asyncio.timeout(TRAILING_SECONDS):
            async for chunk in chunks:
                read += len(chunk)
                if read > MAX_TRAILING_BYTES:
                    return


def _decode(
    decoder: Decoder, events: list[SSEEvent]
) -> tuple[list[StreamEvent], ProviderFailure | None]:
    """Feed SSE events to the decoder, ignoring anything after the terminal event; returns
    what they decoded to and the failure that stopped them, if one did. A read may carry
    many frames: those before a malformed one are still delivered, then the failure."""
    out: list[StreamEvent] = []
    for sse in events:
        if decoder.done:
            break
        try:
            out += decoder.feed(sse)
        except ProviderFailure as failure:
            return out, failure
    return out, None


async def _status_failure(response: httpx.Response) -> ProviderFailure:
    """Classify an HTTP error response from a bounded read of its body."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= MAX_ERROR_BODY_BYTES:
            break
    kind: str | None = None
    try:
        kind = error_kind(orjson.loads(body))
    except orjson.JSONDecodeError:
        pass
    return failure_for_status(response.status_code, kind, retry_after(response.headers))


def retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    # An HTTP date is rare: the email package loads only for one.
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)
