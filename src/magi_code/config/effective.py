"""The effective configuration (``config.get``) and scoped writes (``config.set``).

Selection precedence is environment (``MC_PROVIDER``/``MC_MODEL``) > project > global >
defaults. Layers are folded from lowest to highest: a layer that switches to a different
provider without naming a model drops the lower layer's model (it belonged to another
provider) and the new provider's default model applies. Reasoning comes from project >
global (no environment override); fast mode is global only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from magi_code.config.catalog import (
    CatalogState,
    Clock,
    is_disabled,
    lookup_model,
    model_levels,
    read_catalog,
    resolve_provider,
)
from magi_code.config.ids import is_safe_id
from magi_code.config.payloads import ConfigChange, parse_config_set
from magi_code.config.settings import (
    Layer,
    ProviderDefinition,
    Scope,
    Settings,
    all_providers,
    load_settings,
    update_settings,
)
from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext

DEFAULT_PROVIDER: Final = "anthropic"
DEFAULT_MODELS: Final[dict[str, str]] = {
    "anthropic": "claude-sonnet-4-5",
    "openai-codex": "gpt-5.1-codex",
}
# Model ID used for a custom provider with no cached or declared models yet.
FALLBACK_MODEL: Final = "default"


@dataclass(frozen=True, slots=True)
class Effective:
    """The resolved settings a turn runs with (and ``config.get`` projects)."""

    provider_id: str
    model_id: str
    # ``None`` when the selected provider is not defined (reading does not validate it).
    provider: ProviderDefinition | None
    configured_thinking_level: str
    thinking_level: str
    available_thinking_levels: tuple[str, ...]
    fast: bool
    context_window: int | None
    max_output_tokens: int | None


def _env_layer(env: Mapping[str, str]) -> Layer:
    provider = env.get("MC_PROVIDER") or None
    model = env.get("MC_MODEL") or None
    for value in (provider, model):
        if value is not None and not is_safe_id(value):
            raise ServiceError(ErrorCode.CONFIGURATION_UNAVAILABLE)
    return Layer(provider=provider, model=model)


def default_model(
    ctx: LaunchContext, provider: ProviderDefinition | None, provider_id: str, now: float
) -> str:
    """Built-in defaults; for a custom provider its first cached, then first declared model."""
    if provider_id in DEFAULT_MODELS:
        return DEFAULT_MODELS[provider_id]
    if provider is None:
        return FALLBACK_MODEL
    snapshot = read_catalog(ctx, provider, now)
    if snapshot.models:
        return snapshot.models[0].model_id
    if provider.static_models:
        return provider.static_models[0].model_id
    return FALLBACK_MODEL


def resolve_effective(
    ctx: LaunchContext, settings: Settings, now: Clock = time.time, session: Layer | None = None
) -> Effective:
    """Resolve selection, reasoning and fast mode exactly as ``config.get`` reports them;
    ``session``, a session's own selection and reasoning (RFC-0002 §6.15), over all.

    Raises:
        ServiceError: ``configuration_unavailable`` for an unsafe ``MC_PROVIDER``/``MC_MODEL``.
    """
    provider_id, model_id = DEFAULT_PROVIDER, None
    layers = [settings.global_layer, settings.project_layer, _env_layer(ctx.env)]
    for layer in (*layers, session or Layer()):
        if layer.provider is not None and layer.provider != provider_id:
            provider_id, model_id = layer.provider, None
        if layer.model is not None:
            model_id = layer.model
    provider = all_providers(ctx, settings).get(provider_id)
    at = now()
    if model_id is None:
        model_id = default_model(ctx, provider, provider_id, at)
    configured = settings.configured_thinking_level
    if session is not None and session.thinking_level is not None:
        configured = session.thinking_level
    if provider is None:
        levels: tuple[str, ...] = ("default",)
        context_window = max_output = None
    else:
        info = lookup_model(ctx, settings, provider, model_id, at)
        levels = info.thinking_levels
        context_window, max_output = info.context_window, info.max_output_tokens
    return Effective(
        provider_id=provider_id,
        model_id=model_id,
        provider=provider,
        configured_thinking_level=configured,
        thinking_level=configured if configured in levels else "default",
        available_thinking_levels=levels,
        fast=settings.fast,
        context_window=context_window,
        max_output_tokens=max_output,
    )


def project_config(effective: Effective) -> dict[str, Any]:
    return {
        "selection": {"provider_id": effective.provider_id, "model_id": effective.model_id},
        "thinking_level": effective.thinking_level,
        "configured_thinking_level": effective.configured_thinking_level,
        "available_thinking_levels": list(effective.available_thinking_levels),
        "fast": effective.fast,
        "precedence": ["environment", "project", "global"],
        "writable_scopes": ["global", "project"],
        "global_only": ["fast"],
    }


def effective_config(
    ctx: LaunchContext, settings: Settings, now: Clock = time.time
) -> dict[str, Any]:
    """The ``config.get`` success payload (no fresh catalog needed)."""
    return {**project_config(resolve_effective(ctx, settings, now)), "sandbox": sandbox(settings)}


def sandbox(settings: Settings) -> dict[str, Any]:
    """``sandbox`` of ``config.get``: the level a turn here asks for, whether it shares the
    host network, and whether this service can start the ``workspace_write`` sandbox (a
    turn that asks for it where it cannot fails with ``sandbox_unavailable``). Blocking:
    the first call in a process probes ``bwrap``."""
    from magi_code.tools.sandbox import bubblewrap

    return {
        "level": settings.sandbox,
        "network": settings.sandbox_network,
        "workspace_write_available": bubblewrap().path is not None,
    }


def _validate_target(
    ctx: LaunchContext, settings: Settings, change: ConfigChange, now: float
) -> None:
    """Catalog rules for a selection and/or reasoning change (spec "Persist a scoped change")."""
    if change.selection is not None:
        provider_id, model_id = change.selection
        if not is_safe_id(model_id):
            raise ServiceError(ErrorCode.INVALID_SELECTION)
        provider = resolve_provider(ctx, settings, provider_id)
    else:
        effective = resolve_effective(ctx, settings, lambda: now)
        model_id = effective.model_id
        if effective.provider is None:
            raise ServiceError(ErrorCode.INVALID_SELECTION)
        provider = effective.provider
    snapshot = read_catalog(ctx, provider, now)
    if snapshot.state is CatalogState.UNAVAILABLE:
        raise ServiceError(ErrorCode.CATALOG_UNAVAILABLE)
    if snapshot.state is CatalogState.STALE:
        raise ServiceError(ErrorCode.CATALOG_STALE)
    model = snapshot.find(model_id)
    if model is None or is_disabled(settings, provider.provider_id, model_id):
        raise ServiceError(ErrorCode.INVALID_SELECTION)
    if change.thinking_level is not None and change.thinking_level not in model_levels(
        provider, model, fresh=True
    ):
        raise ServiceError(ErrorCode.UNSUPPORTED_REASONING)


def check_session_selection(ctx: LaunchContext, session: Layer, now: Clock = time.time) -> None:
    """A session's own selection (provider and model) and reasoning obey the catalog rules
    a ``config.set`` of them does. Blocking.

    Raises:
        ServiceError: ``invalid_selection``, ``catalog_unavailable``, ``catalog_stale``,
            ``unsupported_reasoning``, ``configuration_unavailable``.
    """
    assert session.provider is not None and session.model is not None
    change = ConfigChange(Scope.GLOBAL, (session.provider, session.model), session.thinking_level)
    _validate_target(ctx, load_settings(ctx), change, now())


def apply_config_set(ctx: LaunchContext, payload: object, now: Clock = time.time) -> dict[str, Any]:
    """Validate and persist a ``config.set`` request; returns its success payload.

    Validation runs under the settings lock against freshly re-read files, so the
    reasoning-only check sees the same effective selection the write lands on. Explicit
    writes always store the value in the target scope (project pins), and a selection
    without ``thinking_level`` stores ``default``.

    Raises:
        ServiceError: ``invalid_payload``, ``invalid_scope``, ``invalid_selection``,
            ``catalog_unavailable``, ``catalog_stale``, ``unsupported_reasoning``,
            ``configuration_unavailable`` or ``settings_write_failed``.
    """
    change = parse_config_set(payload)

    def mutate(current: Settings, document: dict[str, Any]) -> None:
        at = now()
        if change.selection is not None or change.thinking_level is not None:
            _validate_target(ctx, current, change, at)
        if change.selection is not None:
            document["provider"], document["model"] = change.selection
            document["thinking_level"] = change.thinking_level or "default"
        elif change.thinking_level is not None:
            document["thinking_level"] = change.thinking_level
        if change.fast is not None:
            document["fast"] = change.fast

    def verify(result: Settings) -> None:
        # The resulting projection must resolve before anything is committed.
        resolve_effective(ctx, result, now)

    update_settings(ctx, change.scope, mutate, verify)
    settings = load_settings(ctx)
    return {
        "persisted": True,
        "scope": change.scope.value,
        "effective": effective_config(ctx, settings, now),
    }
