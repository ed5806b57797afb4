"""What every wire-API module provides, plus small JSON helpers they share.

Each API module exposes ``build_call(endpoint, request) -> HttpCall`` and a ``Decoder``
class: ``feed(event)`` turns one SSE event into neutral stream events, ``done`` says the
API's terminal event arrived (stop reading), and ``finish()`` is called at EOF and
raises ``provider_stream_error`` when the terminal event never came.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

import orjson

from magi_code.dataclass import dataclass
from magi_code.providers.errors import FailureLabel, ProviderFailure
from magi_code.providers.sse import SSEEvent
from magi_code.providers.types import StreamEvent

JsonObject = dict[str, object]

# Reasoning levels as OpenAI efforts (chat ``reasoning_effort``, Responses
# ``reasoning.effort``); ``default`` sends none, and the two top levels share ``xhigh``.
REASONING_EFFORT: Final[dict[str, str]] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "x_high": "xhigh",
    "max": "xhigh",
}


@dataclass(frozen=True, slots=True)
class HttpCall:
    url: str
    headers: Mapping[str, str]
    body: JsonObject


class Decoder(Protocol):
    @property
    def done(self) -> bool: ...

    def feed(self, event: SSEEvent) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...


def load_object(data: str) -> JsonObject:
    """Parse one event's JSON payload; anything but an object is a stream error."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ProviderFailure(FailureLabel.STREAM_ERROR) from None
    if not isinstance(value, dict):
        raise ProviderFailure(FailureLabel.STREAM_ERROR)
    return value


def obj(value: object) -> JsonObject:
    return value if isinstance(value, dict) else {}


def text(value: object) -> str:
    return value if isinstance(value, str) else ""


def count(value: object) -> int | None:
    """A token count, or ``None`` when absent or not a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def merged_headers(endpoint_headers: Mapping[str, str], **extra: str) -> dict[str, str]:
    """Protocol headers first; the endpoint's own (auth, overrides) win on conflicts."""
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    lowered = {k.lower() for k in endpoint_headers}
    headers = {k: v for k, v in headers.items() if k not in lowered}
    headers.update(endpoint_headers)
    return headers


def dumps(value: object) -> str:
    return orjson.dumps(value).decode()
