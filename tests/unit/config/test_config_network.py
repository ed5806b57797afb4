"""The settings' ``network`` entry: proxy and CA file, project over global per key, and
validated like every known key (a bad value makes configuration unavailable)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from config_helpers import write_json

from magi_code.config.schema import SETTINGS_SCHEMA, is_valid, project_schema
from magi_code.config.settings import load_settings
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.providers.http import NetworkSettings, transport_options
from magi_code.storage.launch import LaunchContext


def test_missing_network_entry_is_empty(ctx: LaunchContext) -> None:
    assert load_settings(ctx).network == NetworkSettings()


def test_a_trusted_projects_keys_override_global_keys_one_by_one(ctx: LaunchContext) -> None:
    global_network = {"proxy": "http://global:3128", "ca_file": "/etc/global.pem"}
    write_json(ctx.global_settings_path, {"network": global_network})
    write_json(ctx.project_settings_path, {"network": {"proxy": "https://project:8443"}})
    # Untrusted: the project cannot route provider traffic (and credentials) elsewhere.
    assert load_settings(ctx).network == NetworkSettings(**global_network)
    trust = {"network": global_network, "trusted_projects": [str(ctx.project_dir)]}
    write_json(ctx.global_settings_path, trust)
    assert load_settings(ctx).network == NetworkSettings(
        proxy="https://project:8443", ca_file="/etc/global.pem"
    )


def test_the_settings_proxy_and_ca_apply_over_the_launch_environment(
    make_ctx: Callable[..., LaunchContext],
) -> None:
    ctx = make_ctx(HTTPS_PROXY="http://env:1", SSL_CERT_FILE="/env.pem", NO_PROXY="localhost")
    write_json(ctx.global_settings_path, {"network": {"proxy": "http://s:2", "ca_file": "/s.pem"}})
    options = transport_options(ctx.env, load_settings(ctx).network)
    assert dict(options.proxies) == {"all://": "http://s:2", "all://localhost": None}
    assert options.ca_file == "/s.pem"


@pytest.mark.parametrize(
    "network",
    [
        {"proxy": "ftp://proxy:21"},
        {"proxy": "proxy:3128"},
        {"proxy": 3128},
        {"proxy": "http://has space"},
        {"ca_file": "relative/ca.pem"},
        {"ca_file": ""},
        "http://proxy:3128",
    ],
)
def test_invalid_network_values_make_configuration_unavailable(
    ctx: LaunchContext, network: Any
) -> None:
    write_json(ctx.project_settings_path, {"network": network})
    with pytest.raises(ServiceError) as info:
        load_settings(ctx)
    assert info.value.code is ErrorCode.CONFIGURATION_UNAVAILABLE


def test_network_is_allowed_in_both_files_and_unknown_keys_inside_are_kept() -> None:
    document = {"network": {"proxy": "http://p:1", "ca_file": "/ca.pem", "future": True}}
    assert is_valid(document, SETTINGS_SCHEMA)
    assert is_valid(document, project_schema())
    assert "network" in SETTINGS_SCHEMA["properties"]
