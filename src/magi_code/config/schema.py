"""The settings schema: one description, used both to generate the JSON Schema file and
to validate documents on every read and before every write.

Only known keys are described; unknown top-level and nested keys are allowed and kept
(``additionalProperties`` defaults to ``true``). The validator understands exactly the
JSON Schema subset the description uses, so the generated file and the runtime checks
cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Final

import orjson

from magi_code.config.approvals import SCHEMA_PROPERTIES as APPROVAL_PROPERTIES
from magi_code.config.ids import ID_PATTERN, THINKING_LEVELS
from magi_code.providers.types import API_KINDS
from magi_code.storage.files import atomic_write, read_regular
from magi_code.storage.launch import LaunchContext

SCHEMA_FILENAME: Final = "settings.schema.json"
BUILTIN_PROVIDER_IDS: Final = ("anthropic", "openai-codex")
# Keys that only the global (user) settings file may hold.
GLOBAL_ONLY_KEYS: Final = ("fast", "providers", "trusted_projects")
# The events a hook can be configured for (``hooks`` in settings), in the order they occur.
HOOK_EVENTS: Final = ("user_prompt_submit", "pre_tool_use", "post_tool_use", "stop")
MAX_HOOK_TIMEOUT_MS: Final = 600_000
# Where shell and hook commands run (``tools.sandbox``), from the least to the most
# confined: a project's setting can only move a level right.
SANDBOX_LEVELS: Final = ("none", "workspace_write")

_ID: Final[dict[str, Any]] = {"type": "string", "pattern": ID_PATTERN}
_POSITIVE_TOKENS: Final[dict[str, Any]] = {
    "type": "integer",
    "minimum": 1,
    "maximum": 100_000_000,
}
_ENV_NAME: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"

_STATIC_MODEL: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["id"],
    "properties": {
        "id": _ID,
        "label": {"type": "string", "maxLength": 1024},
        "context_window": _POSITIVE_TOKENS,
        "max_output_tokens": _POSITIVE_TOKENS,
    },
}

_PROVIDER: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["api", "base_url"],
    "properties": {
        "api": {"type": "string", "enum": list(API_KINDS)},
        "base_url": {"type": "string", "pattern": r"^https?://[^\s]+$", "maxLength": 2048},
        "api_key_env": {
            "type": "string",
            "pattern": _ENV_NAME,
            "description": "Environment variable holding the API key; absent = no auth.",
        },
        "context_window": _POSITIVE_TOKENS,
        "label": {"type": "string", "maxLength": 1024},
        "models": {
            "type": "array",
            "maxItems": 1000,
            "items": _STATIC_MODEL,
            "description": "Static model list; catalog.refresh uses it instead of discovery.",
        },
    },
}

_MCP_SERVER: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["command"],
    "properties": {
        "command": {"type": "string", "minLength": 1, "maxLength": 4096},
        "args": {"type": "array", "maxItems": 256, "items": {"type": "string"}},
        "env": {
            "type": "object",
            "propertyNames": {"type": "string", "pattern": _ENV_NAME},
            "additionalProperties": {"type": "string"},
        },
    },
}

_NETWORK: Final[dict[str, Any]] = {
    "type": "object",
    "description": (
        "Proxy and CA bundle for provider, catalog and OAuth requests. Each key set in a "
        "trusted project's file (see 'trusted_projects') overrides the global one; they "
        "override the environment's proxy variables and SSL_CERT_FILE/SSL_CERT_DIR "
        "(NO_PROXY still applies)."
    ),
    "properties": {
        "proxy": {
            "type": "string",
            "pattern": r"^https?://[^\s]+$",
            "maxLength": 2048,
            "description": "Proxy URL (http:// or https://) for every request.",
        },
        "ca_file": {
            "type": "string",
            "pattern": r"^/[^\x00]*$",
            "maxLength": 4096,
            "description": "Absolute path of a PEM CA bundle used instead of the default roots.",
        },
    },
}

_HOOK: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["command"],
    "properties": {
        "matcher": {
            "type": "string",
            "minLength": 1,
            "maxLength": 256,
            "description": "Tool-name pattern (fnmatch); default '*'. Tool hooks only.",
        },
        "command": {
            "type": "array",
            "minItems": 1,
            "maxItems": 256,
            "items": {"type": "string", "pattern": r"^[^\x00]*$", "maxLength": 4096},
            "description": "The program and its arguments (no shell), run in the project.",
        },
        "timeout_ms": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_HOOK_TIMEOUT_MS,
            "description": "Time limit in milliseconds (default 60000), then it is killed.",
        },
    },
}

_HOOKS: Final[dict[str, Any]] = {
    "type": "object",
    "description": (
        "Commands run at points of a turn, by event. The project file's hooks run only when "
        "the global 'trusted_projects' lists the project directory."
    ),
    "properties": {
        event: {"type": "array", "maxItems": 32, "items": _HOOK} for event in HOOK_EVENTS
    },
}

SETTINGS_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "magi-code settings",
    "description": (
        "Global ($MC_HOME/settings.json) and project (.magi-code/settings.json) settings. "
        "Unknown keys are allowed and preserved. 'fast', 'providers' and 'trusted_projects' are "
        "global-only."
    ),
    "type": "object",
    "properties": {
        "provider": _ID,
        "model": _ID,
        "thinking_level": {"type": "string", "enum": list(THINKING_LEVELS)},
        "fast": {"type": "boolean", "description": "Global only."},
        "providers": {
            "type": "object",
            "description": "Global only. Custom provider definitions by provider ID.",
            "propertyNames": {
                "type": "string",
                "pattern": ID_PATTERN,
                "not": {"enum": list(BUILTIN_PROVIDER_IDS)},
            },
            "additionalProperties": _PROVIDER,
        },
        "disabled_models": {
            "type": "object",
            "description": "Model IDs shown as unavailable, by provider ID.",
            "propertyNames": {"type": "string", "pattern": ID_PATTERN},
            "additionalProperties": {"type": "array", "maxItems": 1000, "items": _ID},
        },
        "mcp_servers": {
            "type": "object",
            "description": (
                "MCP servers by name. A trusted project's entry (see 'trusted_projects') "
                "replaces the global one with the same name."
            ),
            "propertyNames": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,64}$"},
            "additionalProperties": _MCP_SERVER,
        },
        "network": _NETWORK,
        "hooks": _HOOKS,
        "sandbox": {
            "type": "string",
            "enum": list(SANDBOX_LEVELS),
            "description": (
                "Where shell and hook commands run: 'none' (as the user) or "
                "'workspace_write' (Linux: bubblewrap, the filesystem read-only but the project "
                "and a private /tmp, no network). The stricter of the global and project "
                "values applies."
            ),
        },
        "sandbox_network": {
            "type": "boolean",
            "description": (
                "Whether the workspace_write sandbox shares the host network (default false). "
                "A project file can only turn it off."
            ),
        },
        "trusted_projects": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "string", "pattern": r"^/[^\x00]*$", "maxLength": 4096},
            "description": (
                "Global only. Absolute project directories whose settings file may configure "
                "hooks, mcp_servers and network (elsewhere those entries are ignored)."
            ),
        },
        **APPROVAL_PROPERTIES,
    },
}


@cache
def project_schema() -> dict[str, Any]:
    """The global schema with global-only keys forbidden (``false`` schemas)."""
    properties = dict(SETTINGS_SCHEMA["properties"])
    for key in GLOBAL_ONLY_KEYS:
        properties[key] = False
    return {**SETTINGS_SCHEMA, "properties": properties}


_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
}


def is_valid(value: object, schema: Mapping[str, Any] | bool) -> bool:
    """Check ``value`` against the schema subset used above."""
    if isinstance(schema, bool):
        return schema
    kind = schema.get("type")
    if kind is not None:
        if not isinstance(value, _TYPES[kind]):
            return False
        # JSON booleans are not integers.
        if kind == "integer" and isinstance(value, bool):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "not" in schema and is_valid(value, schema["not"]):
        return False
    if isinstance(value, str):
        return _valid_string(value, schema)
    if isinstance(value, int) and not isinstance(value, bool):
        low: int = schema.get("minimum", value)
        high: int = schema.get("maximum", value)
        return low <= value <= high
    if isinstance(value, list):
        size = len(value)
        return schema.get("minItems", 0) <= size <= schema.get("maxItems", size) and all(
            is_valid(item, schema.get("items", True)) for item in value
        )
    if isinstance(value, dict):
        return _valid_object(value, schema)
    return True


def _valid_string(value: str, schema: Mapping[str, Any]) -> bool:
    if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
        return False
    pattern = schema.get("pattern")
    return pattern is None or re.fullmatch(pattern, value) is not None


def _valid_object(value: dict[Any, Any], schema: Mapping[str, Any]) -> bool:
    if any(key not in value for key in schema.get("required", ())):
        return False
    properties: Mapping[str, Any] = schema.get("properties", {})
    names = schema.get("propertyNames", True)
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if not is_valid(key, names):
            return False
        if not is_valid(item, properties.get(key, extra)):
            return False
    return True


def schema_bytes() -> bytes:
    return orjson.dumps(SETTINGS_SCHEMA, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def write_settings_schema(ctx: LaunchContext) -> None:
    """Write ``settings.schema.json`` beside the global settings file; no-op when current.

    Raises:
        OSError: the file could not be written (startup reports it on stderr).
    """
    path = ctx.global_settings_path.parent / SCHEMA_FILENAME
    data = schema_bytes()
    try:
        # Never blocks on a FIFO planted at the path (the write below replaces it).
        if read_regular(path, len(data), follow_symlinks=False) == data:
            return
    except OSError:
        pass
    # The schema holds no user data, so it is world-readable like any generated doc.
    atomic_write(path, data, mode=0o644)
