"""Model discovery per wire API (for the catalog layer).

- anthropic: ``GET {base}/v1/models?limit=…`` following ``has_more``/``last_id`` (as
  ``after_id``) for at most ``MAX_PAGES`` pages.
- openai-chat: ``GET {base}/models`` → ``{"data":[{"id"}]}``.
- openai-responses (Codex backend): ``GET {base}/models?client_version=…`` →
  ``{"models":[{slug, display_name, context_window, supported_reasoning_levels}]}``;
  an OpenAI-style ``{"data":[…]}`` listing is accepted too. Models whose
  ``visibility`` is set and not ``"list"`` are hidden by the backend and skipped.

Entries are returned raw (IDs/labels unsanitised): the catalog layer filters them.
Failures raise ``ProviderFailure``; bodies are read with a size bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import orjson

from magi_code.dataclass import dataclass
from magi_code.providers import anthropic
from magi_code.providers.errors import (
    FailureLabel,
    ProviderFailure,
    error_kind,
    failure_for_status,
    map_httpx_errors,
)
from magi_code.providers.types import Endpoint, ReasoningLevel
from magi_code.providers.wire import JsonObject, count, obj, text

if TYPE_CHECKING:
    import httpx

MAX_PAGES: Final = 10
PAGE_LIMIT: Final = 100
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
DEFAULT_CLIENT_VERSION: Final = "0.128.0"
_EFFORTS: Final[dict[str, ReasoningLevel]] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "x_high",
}


@dataclass(frozen=True, slots=True)
class DiscoveredModel:
    model_id: str
    label: str
    context_window: int | None
    max_output_tokens: int | None
    reasoning_levels: tuple[ReasoningLevel, ...] | None
    """Levels the provider lists (mapped to ours), or ``None`` when it says nothing."""


async def list_models(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    *,
    client_version: str = DEFAULT_CLIENT_VERSION,
) -> list[DiscoveredModel]:
    """List the endpoint's models.

    Raises:
        ProviderFailure: HTTP/transport failure or an unreadable listing.
    """
    if endpoint.api == "anthropic":
        return await _anthropic(client, endpoint)
    if endpoint.api == "openai-chat":
        return _openai_list(await _get_json(client, endpoint, "/models", {}))
    body = await _get_json(client, endpoint, "/models", {"client_version": client_version})
    if isinstance(body.get("models"), list):
        return _codex_list(body)
    return _openai_list(body)


async def _anthropic(client: httpx.AsyncClient, endpoint: Endpoint) -> list[DiscoveredModel]:
    models: list[DiscoveredModel] = []
    params: dict[str, str] = {"limit": str(PAGE_LIMIT)}
    headers = {"anthropic-version": anthropic.API_VERSION}
    for _ in range(MAX_PAGES):
        body = await _get_json(client, endpoint, "/v1/models", params, headers)
        for entry in _entries(body.get("data")):
            model_id = text(entry.get("id"))
            if model_id:
                models.append(
                    DiscoveredModel(
                        model_id=model_id,
                        label=text(entry.get("display_name")) or model_id,
                        context_window=count(entry.get("max_input_tokens")),
                        max_output_tokens=count(entry.get("max_tokens")),
                        reasoning_levels=None,
                    )
                )
        last_id = text(body.get("last_id"))
        if body.get("has_more") is not True or not last_id:
            break
        params = {"limit": str(PAGE_LIMIT), "after_id": last_id}
    return models


def _openai_list(body: JsonObject) -> list[DiscoveredModel]:
    models = []
    for entry in _entries(body.get("data")):
        model_id = text(entry.get("id"))
        if model_id:
            models.append(DiscoveredModel(model_id, model_id, None, None, None))
    return models


def _codex_list(body: JsonObject) -> list[DiscoveredModel]:
    models = []
    for entry in _entries(body.get("models")):
        slug = text(entry.get("slug"))
        visibility = entry.get("visibility")
        if not slug or (visibility is not None and visibility != "list"):
            continue
        levels: tuple[ReasoningLevel, ...] | None = None
        supported = entry.get("supported_reasoning_levels")
        if isinstance(supported, list):
            efforts = [_EFFORTS.get(text(obj(level).get("effort"))) for level in supported]
            levels = tuple(level for level in efforts if level is not None)
        models.append(
            DiscoveredModel(
                model_id=slug,
                label=text(entry.get("display_name")) or slug,
                context_window=count(entry.get("context_window")),
                max_output_tokens=None,
                reasoning_levels=levels,
            )
        )
    return models


def _entries(value: object) -> list[JsonObject]:
    if not isinstance(value, list):
        raise ProviderFailure(FailureLabel.STREAM_ERROR)
    return [entry for entry in value if isinstance(entry, dict)]


async def _get_json(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    path: str,
    params: dict[str, str],
    extra_headers: dict[str, str] | None = None,
) -> JsonObject:
    import httpx

    headers = {"accept": "application/json", **(extra_headers or {}), **endpoint.headers}
    timeout = httpx.Timeout(30.0, connect=10.0)
    body = bytearray()
    with map_httpx_errors():
        async with client.stream(
            "GET", endpoint.url(path), params=params, headers=headers, timeout=timeout
        ) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    if response.is_success:
                        raise ProviderFailure(FailureLabel.STREAM_ERROR)
                    break
            status = response.status_code
            success = response.is_success
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        value = None
    if not success:
        raise failure_for_status(status, error_kind(value))
    if not isinstance(value, dict):
        raise ProviderFailure(FailureLabel.STREAM_ERROR)
    return value
