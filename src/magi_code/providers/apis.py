"""One profile per provider API: everything that differs between the APIs, in one record.

Adding an API is its wire module (``anthropic``, ``openai_chat``, ``openai_responses``),
its name in ``types.ApiKind`` and its profile here; whatever else depends on the API
(streaming, the settings schema, the catalog's fallback levels, a turn's context window,
how a custom provider's key is sent) reads the profile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.providers import anthropic, openai_chat, openai_responses
from magi_code.providers.types import ApiKind, Endpoint, ProviderRequest, ReasoningLevel
from magi_code.providers.wire import Decoder, HttpCall


@dataclass(frozen=True, slots=True)
class ApiProfile:
    api: ApiKind
    build_call: Callable[[Endpoint, ProviderRequest], HttpCall]
    decoder: Callable[[], Decoder]
    # The reasoning choices offered when no fresh model metadata exists.
    fallback_levels: tuple[ReasoningLevel, ...]
    # The context window for estimates and compaction when neither discovery nor the
    # provider definition says otherwise.
    context_window: int
    # A custom provider's API key goes in ``x-api-key`` (else as an ``Authorization``
    # bearer token).
    key_in_x_api_key: bool = False


_PROFILES: Final = (
    ApiProfile(
        api="openai-chat",
        build_call=openai_chat.build_call,
        decoder=openai_chat.Decoder,
        fallback_levels=("default",),
        context_window=128_000,
    ),
    ApiProfile(
        api="anthropic",
        build_call=anthropic.build_call,
        decoder=anthropic.Decoder,
        fallback_levels=("default", "low", "medium", "high", "max"),
        context_window=200_000,
        key_in_x_api_key=True,
    ),
    ApiProfile(
        api="openai-responses",
        build_call=openai_responses.build_call,
        decoder=openai_responses.Decoder,
        fallback_levels=("default", "low", "medium", "high", "x_high"),
        context_window=272_000,
    ),
)
# One per ``ApiKind`` (tests/unit/providers/test_provider_apis.py checks).
API_PROFILES: Final[Mapping[ApiKind, ApiProfile]] = {p.api: p for p in _PROFILES}
