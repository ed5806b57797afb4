"""Model catalog cache and the catalog projections.

Theory of operation: ``catalog.refresh`` is the only path that talks to a provider. It
runs discovery (or takes a custom provider's static ``models`` list), filters the result
(unsafe IDs omitted, labels sanitized, duplicates dropped, order kept) and writes one
cache file per provider atomically. The file records when it was fetched and a
fingerprint of the provider configuration it was fetched for. Reads are cache-only and
classify the file (spec "Provider and model catalogs"):

- ``fresh_cache``: readable, matching fingerprint, younger than :data:`CATALOG_TTL_SECONDS`;
- ``stale``: readable and matching but expired: shown, never selectable;
- ``unavailable``: missing, unreadable, malformed, empty or for another configuration.

Cache reads/writes block and are run off the event loop by callers (``refresh`` does its
own ``to_thread``). Every clock is injectable (``now``) so tests never sleep.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from magi_code.config.ids import is_safe_id, normalize_levels, sanitize_label
from magi_code.config.settings import ProviderDefinition, Settings, all_providers
from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_CATALOG_PAGE_ITEMS
from magi_code.providers.apis import API_PROFILES
from magi_code.providers.discovery import list_models
from magi_code.providers.errors import ProviderFailure, httpx_exceptions
from magi_code.providers.http import ClientSource, as_source
from magi_code.providers.types import Endpoint
from magi_code.storage.files import atomic_write, read_regular
from magi_code.storage.launch import LaunchContext

if TYPE_CHECKING:
    import httpx

CATALOG_TTL_SECONDS: Final = 3600.0
# A fetch time further in the future than this means the clock moved back: not fresh.
MAX_CLOCK_SKEW_SECONDS: Final = 300.0
CACHE_VERSION: Final = 1
MAX_CACHE_BYTES: Final = 4 << 20
MAX_CACHED_MODELS: Final = 1000
MAX_PAGE_OFFSET: Final = 100_000

Clock = Callable[[], float]


class CatalogState(StrEnum):
    FRESH = "fresh_cache"
    STALE = "stale"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class CatalogModel:
    model_id: str
    label: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    # ``None``: discovery said nothing about reasoning, so the provider fallback applies.
    reasoning_levels: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class CatalogSnapshot:
    state: CatalogState
    models: tuple[CatalogModel, ...] = ()

    def find(self, model_id: str) -> CatalogModel | None:
        return next((m for m in self.models if m.model_id == model_id), None)


_UNAVAILABLE: Final = CatalogSnapshot(CatalogState.UNAVAILABLE)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the turn path and ``config.set`` need to know about one selected model."""

    context_window: int | None
    max_output_tokens: int | None
    thinking_levels: tuple[str, ...]
    selectable: bool


# -- cache file --------------------------------------------------------------------------


def cache_path(ctx: LaunchContext, provider_id: str) -> Path:
    return ctx.catalog_dir / _cache_name(provider_id)


@functools.lru_cache(maxsize=64)
def _cache_name(provider_id: str) -> str:
    # IDs may contain "/" and ".."; a digest keeps every cache file inside catalog_dir.
    # Kept, not made anew for every turn: pathlib interns every part of a path, and a name
    # interned and freed again for each turn leaves slots in CPython's table of interned
    # strings behind until the table is rebuilt larger (~1 MiB, for the daemon's life).
    return f"{hashlib.sha256(provider_id.encode()).hexdigest()[:32]}.json"


def fingerprint(provider: ProviderDefinition) -> str:
    """Identifies the configuration a cache was fetched for; any change invalidates it."""
    static = None
    if provider.static_models is not None:
        static = [
            [m.model_id, m.label, m.context_window, m.max_output_tokens]
            for m in provider.static_models
        ]
    material = orjson.dumps([CACHE_VERSION, provider.api, provider.base_url, static])
    return hashlib.sha256(material).hexdigest()


def _positive_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _clean(
    raw: Iterable[tuple[object, object, object, object, object]],
) -> tuple[CatalogModel, ...]:
    """Filter (id, label, context, max_output, levels) rows into safe, unique models."""
    models: dict[str, CatalogModel] = {}
    for model_id, label, context, max_output, levels in raw:
        if not is_safe_id(model_id) or model_id in models:
            continue
        reasoning = None
        if isinstance(levels, list | tuple):
            reasoning = tuple(normalize_levels(levels))
        models[model_id] = CatalogModel(
            model_id=model_id,
            label=sanitize_label(label, model_id),
            context_window=_positive_int(context),
            max_output_tokens=_positive_int(max_output),
            reasoning_levels=reasoning,
        )
        if len(models) >= MAX_CACHED_MODELS:
            break
    return tuple(models.values())


def write_catalog(
    ctx: LaunchContext,
    provider: ProviderDefinition,
    models: Sequence[CatalogModel],
    fetched_at: float,
) -> None:
    """Atomically replace the provider's cache file.

    Raises:
        OSError: the file could not be written.
    """
    document = {
        "version": CACHE_VERSION,
        "provider_id": provider.provider_id,
        "fingerprint": fingerprint(provider),
        "fetched_at": fetched_at,
        "models": [
            {
                "model_id": m.model_id,
                "label": m.label,
                "context_window": m.context_window,
                "max_output_tokens": m.max_output_tokens,
                "reasoning_levels": None
                if m.reasoning_levels is None
                else list(m.reasoning_levels),
            }
            for m in models
        ],
    }
    atomic_write(cache_path(ctx, provider.provider_id), orjson.dumps(document), mode=0o600)


def _read_bounded(path: Path) -> bytes | None:
    try:
        data = read_regular(path, MAX_CACHE_BYTES, follow_symlinks=False)
    except OSError:
        return None
    return data if len(data) <= MAX_CACHE_BYTES else None


def _parse_models(raw: object) -> tuple[CatalogModel, ...] | None:
    if not isinstance(raw, list):
        return None
    rows: list[tuple[object, object, object, object, object]] = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("model_id"), str):
            return None
        levels = entry.get("reasoning_levels")
        if levels is not None and not isinstance(levels, list):
            return None
        rows.append(
            (
                entry["model_id"],
                entry.get("label"),
                entry.get("context_window"),
                entry.get("max_output_tokens"),
                levels,
            )
        )
    return _clean(rows)


def read_catalog(ctx: LaunchContext, provider: ProviderDefinition, now: float) -> CatalogSnapshot:
    """Classify and load the provider's cache; never raises for a bad file."""
    data = _read_bounded(cache_path(ctx, provider.provider_id))
    if data is None:
        return _UNAVAILABLE
    try:
        document: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _UNAVAILABLE
    if not isinstance(document, dict):
        return _UNAVAILABLE
    fetched_at = document.get("fetched_at")
    if (
        document.get("version") != CACHE_VERSION
        or document.get("provider_id") != provider.provider_id
        or document.get("fingerprint") != fingerprint(provider)
        or not isinstance(fetched_at, int | float)
        or isinstance(fetched_at, bool)
        or not math.isfinite(fetched_at)
    ):
        return _UNAVAILABLE
    models = _parse_models(document.get("models"))
    if not models:
        return _UNAVAILABLE
    age = now - fetched_at
    fresh = -MAX_CLOCK_SKEW_SECONDS <= age < CATALOG_TTL_SECONDS
    return CatalogSnapshot(CatalogState.FRESH if fresh else CatalogState.STALE, models)


# -- lookups -----------------------------------------------------------------------------


def resolve_provider(
    ctx: LaunchContext, settings: Settings, provider_id: str
) -> ProviderDefinition:
    """Raises: ServiceError ``invalid_selection`` for an unsafe or unknown provider ID."""
    provider = all_providers(ctx, settings).get(provider_id) if is_safe_id(provider_id) else None
    if provider is None:
        raise ServiceError(ErrorCode.INVALID_SELECTION)
    return provider


def model_levels(
    provider: ProviderDefinition, model: CatalogModel | None, fresh: bool
) -> list[str]:
    """Fresh metadata decides; otherwise the provider API's fallback list applies."""
    if fresh and model is not None and model.reasoning_levels is not None:
        return list(model.reasoning_levels)
    return list(API_PROFILES[provider.api].fallback_levels)


def is_disabled(settings: Settings, provider_id: str, model_id: str) -> bool:
    return model_id in settings.disabled_models.get(provider_id, frozenset())


def lookup_model(
    ctx: LaunchContext,
    settings: Settings,
    provider: ProviderDefinition,
    model_id: str,
    now: float,
) -> ModelInfo:
    """Token limits and reasoning choices for a model, from the cache when it has it.

    The context window falls back to the provider definition's ``context_window``.
    """
    snapshot = read_catalog(ctx, provider, now)
    model = snapshot.find(model_id)
    fresh = snapshot.state is CatalogState.FRESH
    return ModelInfo(
        context_window=(model.context_window if model else None) or provider.context_window,
        max_output_tokens=model.max_output_tokens if model else None,
        thinking_levels=tuple(model_levels(provider, model, fresh)),
        selectable=fresh
        and model is not None
        and not is_disabled(settings, provider.provider_id, model_id),
    )


# -- projections -------------------------------------------------------------------------


def _page(total: int, offset: int, limit: int) -> tuple[slice, int | None]:
    end = offset + limit
    return slice(offset, end), (end if end < total else None)


def check_page(offset: int, limit: int) -> None:
    """Raises: ServiceError ``invalid_payload`` (negative/zero) or ``limit_exceeded``."""
    if offset < 0 or limit < 1:
        raise ServiceError(ErrorCode.INVALID_PAYLOAD)
    if offset > MAX_PAGE_OFFSET or limit > MAX_CATALOG_PAGE_ITEMS:
        raise ServiceError(ErrorCode.LIMIT_EXCEEDED)


def provider_page(
    ctx: LaunchContext, settings: Settings, offset: int = 0, limit: int = MAX_CATALOG_PAGE_ITEMS
) -> dict[str, Any]:
    """The ``catalog.providers`` success payload."""
    check_page(offset, limit)
    providers = list(all_providers(ctx, settings).values())
    window, next_offset = _page(len(providers), offset, limit)
    return {
        "entries": [
            {"provider_id": p.provider_id, "label": sanitize_label(p.label, p.provider_id)}
            for p in providers[window]
        ],
        "next_offset": next_offset,
        "refresh": "cache_only",
    }


def model_page(
    ctx: LaunchContext,
    settings: Settings,
    provider_id: str,
    offset: int = 0,
    limit: int = MAX_CATALOG_PAGE_ITEMS,
    now: Clock = time.time,
) -> dict[str, Any]:
    """The ``catalog.models`` success payload.

    Raises:
        ServiceError: ``invalid_payload``/``limit_exceeded`` for paging values,
            ``invalid_selection`` for an unsafe or unknown provider.
    """
    check_page(offset, limit)
    provider = resolve_provider(ctx, settings, provider_id)
    snapshot = read_catalog(ctx, provider, now())
    fresh = snapshot.state is CatalogState.FRESH
    window, next_offset = _page(len(snapshot.models), offset, limit)
    return {
        "entries": [
            {
                "provider_id": provider.provider_id,
                "model_id": m.model_id,
                "label": m.label,
                "available": fresh and not is_disabled(settings, provider.provider_id, m.model_id),
                "context_window": m.context_window or provider.context_window,
                "max_output_tokens": m.max_output_tokens,
                "available_thinking_levels": model_levels(provider, m, fresh),
            }
            for m in snapshot.models[window]
        ],
        "next_offset": next_offset,
        "state": snapshot.state.value,
        "refresh": "cache_only",
    }


# -- refresh -----------------------------------------------------------------------------


def _static_models(provider: ProviderDefinition) -> tuple[CatalogModel, ...]:
    return _clean(
        (m.model_id, m.label, m.context_window, m.max_output_tokens, None)
        for m in provider.static_models or ()
    )


async def _discovered_models(
    provider: ProviderDefinition,
    clients: ClientSource,
    headers: Mapping[str, str],
) -> tuple[CatalogModel, ...]:
    endpoint = Endpoint(api=provider.api, base_url=provider.base_url, headers=dict(headers))
    try:
        # The client of this endpoint and credential, with the caller's proxy and CAs.
        async with clients.lease(provider.base_url, headers) as client:
            found = await list_models(client, endpoint)
    # Provider details (status, body, URL) never leave this function.
    except ProviderFailure:
        raise ServiceError(ErrorCode.CATALOG_REFRESH_FAILED) from None
    except httpx_exceptions():
        raise ServiceError(ErrorCode.CATALOG_REFRESH_FAILED) from None
    return _clean(
        (m.model_id, m.label, m.context_window, m.max_output_tokens, m.reasoning_levels)
        for m in found
    )


async def refresh(
    ctx: LaunchContext,
    settings: Settings,
    provider_id: str,
    client: httpx.AsyncClient | ClientSource,
    credentials_headers: Mapping[str, str],
    now: Clock = time.time,
) -> dict[str, Any]:
    """The ``catalog.refresh`` success payload: discover, cache, report the cache state.

    ``credentials_headers`` are resolved by the caller (auth domain); ``client`` is a
    client or where to lease one (``providers.http``: per endpoint, credential, proxy
    and CA). A custom provider with a static ``models`` list is cached without any
    network request.

    Raises:
        ServiceError: ``invalid_selection`` for an unsafe/unknown provider;
            ``catalog_refresh_failed`` when discovery fails, finds no usable model, or the
            cache cannot be written (the previous cache is then left untouched).
    """
    provider = resolve_provider(ctx, settings, provider_id)
    if provider.static_models is not None:
        models = _static_models(provider)
    else:
        models = await _discovered_models(provider, as_source(client), credentials_headers)
    if not models:
        raise ServiceError(ErrorCode.CATALOG_REFRESH_FAILED)
    try:
        await asyncio.to_thread(write_catalog, ctx, provider, models, now())
    except OSError:
        raise ServiceError(ErrorCode.CATALOG_REFRESH_FAILED) from None
    snapshot = await asyncio.to_thread(read_catalog, ctx, provider, now())
    return {"provider_id": provider.provider_id, "state": snapshot.state.value}
