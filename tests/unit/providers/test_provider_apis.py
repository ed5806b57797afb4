"""One profile per provider API, and what reads it agrees with it."""

from __future__ import annotations

from typing import get_args

from magi_code.config.schema import SETTINGS_SCHEMA
from magi_code.providers import API_KINDS, REASONING_LEVELS, ApiKind
from magi_code.providers.apis import API_PROFILES


def test_every_api_kind_has_exactly_one_profile() -> None:
    assert list(API_PROFILES) == list(API_KINDS) == list(get_args(ApiKind))
    for api, profile in API_PROFILES.items():
        assert profile.api == api


def test_the_fallback_levels_are_known_levels_in_wire_order_from_default() -> None:
    for profile in API_PROFILES.values():
        levels = list(profile.fallback_levels)
        assert levels[0] == "default", profile.api
        assert levels == [level for level in REASONING_LEVELS if level in levels], profile.api


def test_the_settings_schema_offers_exactly_the_profiled_apis() -> None:
    provider = SETTINGS_SCHEMA["properties"]["providers"]["additionalProperties"]
    assert provider["properties"]["api"]["enum"] == list(API_PROFILES)
