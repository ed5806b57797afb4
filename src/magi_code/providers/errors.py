"""The one provider failure type and the translation of httpx errors into it.

Every failure leaving this package is ``ProviderFailure`` carrying a label from the
closed ``FailureLabel`` set. ``str()`` of the exception is the label alone: URLs,
headers, bodies and provider text never reach it (they may hold secrets or paths).

httpx exception tree (``httpx/_exceptions.py``) and where each lands::

    HTTPError
    ├── HTTPStatusError ............................ by status (see ``failure_for_status``)
    └── RequestError
        ├── TransportError
        │   ├── TimeoutException (Connect/Read/Write/Pool) ... provider_timeout
        │   ├── NetworkError: ConnectError ............. provider_unavailable (retryable)
        │   │                 Read/Write/CloseError .... provider_stream_error
        │   ├── ProtocolError (Local/Remote) ........... provider_stream_error
        │   ├── ProxyError, UnsupportedProtocol ........ provider_http_error
        ├── DecodingError ............................. provider_stream_error
        └── TooManyRedirects .......................... provider_http_error
    InvalidURL, CookieConflict ........................ provider_http_error
    StreamError (StreamConsumed, StreamClosed, ResponseNotRead, RequestNotRead)
                                                        provider_stream_error
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Final


class FailureLabel(StrEnum):
    HTTP_ERROR = "provider_http_error"
    AUTH_FAILED = "provider_auth_failed"
    RATE_LIMITED = "provider_rate_limited"
    QUOTA_EXCEEDED = "provider_quota_exceeded"
    SERVER_ERROR = "provider_server_error"
    UNAVAILABLE = "provider_unavailable"
    TIMEOUT = "provider_timeout"
    STREAM_ERROR = "provider_stream_error"
    INCOMPLETE = "provider_incomplete"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class ProviderFailure(Exception):
    """A provider request failed; ``label`` says how, nothing else is exposed.

    ``status`` is the HTTP status when one was received (callers use 401 to trigger a
    credential refresh). ``retryable``/``retry_after`` are advisory for the retry loop.
    """

    def __init__(
        self,
        label: FailureLabel,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(label.value)
        self.label = label
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.retries = 0  # how many times the request was retried before this failure

    def __str__(self) -> str:
        return self.label.value

    def __repr__(self) -> str:
        return f"ProviderFailure({self.label.value!r}, status={self.status!r})"


@functools.cache
def _httpx_labels() -> dict[type[Exception], tuple[FailureLabel, bool]]:
    """Explicit per-class table, most specific class wins (walk of the MRO); the unit test
    enumerates httpx's exported exception classes and fails on any missing entry.

    Built on first use: httpx is imported only when a request is made or the daemon warms
    its HTTP stack after it is ready (``turns.runtime.TURN_MODULES``), not while it starts.
    """
    import httpx

    return {
        httpx.ConnectTimeout: (FailureLabel.TIMEOUT, True),
        httpx.PoolTimeout: (FailureLabel.TIMEOUT, True),
        httpx.ReadTimeout: (FailureLabel.TIMEOUT, False),
        httpx.WriteTimeout: (FailureLabel.TIMEOUT, False),
        httpx.TimeoutException: (FailureLabel.TIMEOUT, False),
        httpx.ConnectError: (FailureLabel.UNAVAILABLE, True),
        httpx.ReadError: (FailureLabel.STREAM_ERROR, False),
        httpx.WriteError: (FailureLabel.STREAM_ERROR, False),
        httpx.CloseError: (FailureLabel.STREAM_ERROR, False),
        httpx.NetworkError: (FailureLabel.STREAM_ERROR, False),
        httpx.RemoteProtocolError: (FailureLabel.STREAM_ERROR, False),
        httpx.LocalProtocolError: (FailureLabel.STREAM_ERROR, False),
        httpx.ProtocolError: (FailureLabel.STREAM_ERROR, False),
        httpx.ProxyError: (FailureLabel.HTTP_ERROR, False),
        httpx.UnsupportedProtocol: (FailureLabel.HTTP_ERROR, False),
        httpx.TransportError: (FailureLabel.STREAM_ERROR, False),
        httpx.DecodingError: (FailureLabel.STREAM_ERROR, False),
        httpx.TooManyRedirects: (FailureLabel.HTTP_ERROR, False),
        httpx.RequestError: (FailureLabel.HTTP_ERROR, False),
        httpx.HTTPStatusError: (FailureLabel.HTTP_ERROR, False),
        httpx.HTTPError: (FailureLabel.HTTP_ERROR, False),
        httpx.InvalidURL: (FailureLabel.HTTP_ERROR, False),
        httpx.CookieConflict: (FailureLabel.HTTP_ERROR, False),
        httpx.StreamConsumed: (FailureLabel.STREAM_ERROR, False),
        httpx.StreamClosed: (FailureLabel.STREAM_ERROR, False),
        httpx.ResponseNotRead: (FailureLabel.STREAM_ERROR, False),
        httpx.RequestNotRead: (FailureLabel.STREAM_ERROR, False),
        httpx.StreamError: (FailureLabel.STREAM_ERROR, False),
    }


@functools.cache
def httpx_exceptions() -> tuple[type[Exception], ...]:
    """Every httpx exception class, for ``except httpx_exceptions():`` (evaluated only
    when an exception is being matched)."""
    return tuple(_httpx_labels())


def failure_for_httpx(exc: Exception) -> ProviderFailure:
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return failure_for_status(exc.response.status_code)
    labels = _httpx_labels()
    for cls in type(exc).__mro__:
        entry = labels.get(cls)
        if entry is not None:
            label, retryable = entry
            return ProviderFailure(label, retryable=retryable)
    return ProviderFailure(FailureLabel.HTTP_ERROR)


@contextmanager
def map_httpx_errors() -> Iterator[None]:
    """Translate any httpx exception raised in the block into ``ProviderFailure``.

    The original is chained as ``__cause__`` for debugging only; it is never formatted
    into the failure's message.
    """
    try:
        yield
    except httpx_exceptions() as exc:
        raise failure_for_httpx(exc) from exc


def failure_for_status(
    status: int, error_kind: str | None = None, retry_after: float | None = None
) -> ProviderFailure:
    """Classify an HTTP error status (plus the provider's error code/type, if parsed).

    ``error_kind`` is only matched against known codes, never copied into the failure.
    """
    kind_label = label_for_error_kind(error_kind)
    if kind_label in (FailureLabel.CONTEXT_LENGTH_EXCEEDED, FailureLabel.QUOTA_EXCEEDED):
        return ProviderFailure(kind_label, status=status)
    if status in (401, 403):
        return ProviderFailure(FailureLabel.AUTH_FAILED, status=status)
    if status == 429:
        return ProviderFailure(
            FailureLabel.RATE_LIMITED, status=status, retryable=True, retry_after=retry_after
        )
    if status >= 500:
        # The provider was reached and failed (``provider_unavailable`` is for a provider
        # that could not be reached at all).
        return ProviderFailure(
            FailureLabel.SERVER_ERROR, status=status, retryable=True, retry_after=retry_after
        )
    if status in (408, 409):
        return ProviderFailure(
            FailureLabel.HTTP_ERROR, status=status, retryable=True, retry_after=retry_after
        )
    return ProviderFailure(FailureLabel.HTTP_ERROR, status=status)


_CONTEXT_KINDS: Final = frozenset(
    {"context_length_exceeded", "model_context_window_exceeded", "string_above_max_length"}
)
_QUOTA_KINDS: Final = frozenset({"insufficient_quota", "usage_limit_reached", "usage_not_included"})
_RATE_KINDS: Final = frozenset({"rate_limit_exceeded", "rate_limit_error", "rate_limited"})
# Provider message fragments that identify an over-long prompt when the code is generic
# (Anthropic: 400 invalid_request_error "prompt is too long: …"; OpenAI-compatible
# servers: "maximum context length is …"). Matched only, never copied.
_CONTEXT_PHRASES: Final = ("prompt is too long", "maximum context length", "context length")


def label_for_error_kind(kind: str | None) -> FailureLabel | None:
    """Map a provider error ``code``/``type`` string to a label, or ``None`` if unknown."""
    if not kind:
        return None
    if kind in _CONTEXT_KINDS:
        return FailureLabel.CONTEXT_LENGTH_EXCEEDED
    if kind in _QUOTA_KINDS:
        return FailureLabel.QUOTA_EXCEEDED
    if kind in _RATE_KINDS:
        return FailureLabel.RATE_LIMITED
    return None


def error_kind(error: object) -> str | None:
    """Extract a known error code from a provider error object, without keeping its text.

    Accepts the shapes ``{"error":{"code"|"type","message"}}``, ``{"code"|"type"}`` and
    ``{"detail": "..."}``; returns the code/type, or ``context_length_exceeded`` when the
    message names an over-long prompt.
    """
    if not isinstance(error, dict):
        return None
    inner = error.get("error")
    if isinstance(inner, dict):
        return error_kind(inner)
    message = error.get("message", error.get("detail"))
    if isinstance(message, str):
        lowered = message.lower()
        if any(phrase in lowered for phrase in _CONTEXT_PHRASES):
            return "context_length_exceeded"
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and label_for_error_kind(value) is not None:
            return value
    code = error.get("code")
    return code if isinstance(code, str) else None


def stream_failure(error: object) -> ProviderFailure:
    """A failure reported inside a 200 stream (error event, ``response.failed`` …).

    Known codes keep their meaning (context length, quota, rate limit); anything else is
    a ``provider_stream_error``.
    """
    return ProviderFailure(label_for_error_kind(error_kind(error)) or FailureLabel.STREAM_ERROR)
