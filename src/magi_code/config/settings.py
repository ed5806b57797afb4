"""Settings files: bounded validated reads, the merged view, and the one locked writer.

Theory of operation: the global file (``$MC_HOME/settings.json``) and the project file
(``<project>/.magi-code/settings.json``) are JSON objects; a missing file is ``{}``. Every
read is size-bounded and validated against :mod:`magi_code.config.schema`; anything
unreadable or invalid raises ``configuration_unavailable`` instead of being guessed at.
All writes go through :func:`update_settings`, which takes the cross-process lock, re-reads
the target file, lets the caller validate and mutate the re-read document (unknown keys
untouched), re-validates it and replaces the file atomically. All functions here block;
callers run them off the event loop.

The project file arrives with the repository, so what in it acts on the machine
(``TRUST_GATED``: the commands of ``hooks`` and ``mcp_servers``, and ``network``, which
could route provider traffic and its credentials through a proxy and CA of its choosing)
is part of the merged view only when the global ``trusted_projects`` names the project
directory; otherwise it is validated and ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import orjson

from magi_code.config.approvals import APPROVAL_KEYS, ApprovalSettings, build_approvals
from magi_code.config.ids import looks_secret
from magi_code.config.schema import (
    HOOK_EVENTS,
    SANDBOX_LEVELS,
    SETTINGS_SCHEMA,
    is_valid,
    project_schema,
)
from magi_code.dataclass import dataclass, field
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.providers.http import NetworkSettings
from magi_code.providers.types import ApiKind
from magi_code.storage.files import atomic_write, locked, read_regular
from magi_code.storage.launch import PROJECT_CONFIG_DIR, LaunchContext, inside_project

log = logging.getLogger(__name__)
# The last problem logged per settings file (a daemon reads many projects' files).
_reported: dict[Path, str | None] = {}
MAX_REPORTED_FILES: Final = 1024
# Project-file keys used only in a trusted project (see the module docstring).
TRUST_GATED: Final = ("hooks", "mcp_servers", "network")
# Projects whose ignored keys, or whose .magi-code leading out of them, were already
# logged (a daemon serves many projects).
_untrusted_logged: set[str] = set()
_outside_logged: set[str] = set()
MAX_LOGGED_PROJECTS: Final = 1024

MAX_SETTINGS_BYTES: Final = 1 << 20
# Settings may carry MCP server environments (tokens), so they are private to the user.
SETTINGS_FILE_MODE: Final = 0o600

DEFAULT_ANTHROPIC_BASE_URL: Final = "https://api.anthropic.com"
DEFAULT_CODEX_BASE_URL: Final = "https://chatgpt.com/backend-api/codex"


class Scope(StrEnum):
    GLOBAL = "global"
    PROJECT = "project"


@dataclass(frozen=True, slots=True)
class StaticModel:
    model_id: str
    label: str | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ProviderDefinition:
    """A provider the service can talk to.

    ``credential`` says where auth comes from: ``api_key`` (built-in Anthropic: shared
    credentials or its key variable), ``oauth`` (built-in Codex), ``env`` (custom provider,
    key in the variable named by ``api_key_env``) or ``none`` (custom provider without auth).
    """

    provider_id: str
    api: ApiKind
    base_url: str
    api_key_env: str | None = None
    context_window: int | None = None
    label: str | None = None
    credential: str = "none"
    static_models: tuple[StaticModel, ...] | None = None


@dataclass(frozen=True, slots=True)
class McpServerDefinition:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


DEFAULT_HOOK_TIMEOUT_MS: Final = 60_000


@dataclass(frozen=True, slots=True)
class HookDefinition:
    """One configured hook: run ``command`` for the events whose tool name ``matcher``
    matches (tool events only), killed after ``timeout_ms``."""

    command: tuple[str, ...]
    matcher: str = "*"
    timeout_ms: int = DEFAULT_HOOK_TIMEOUT_MS


# Hooks by event name (``config.schema.HOOK_EVENTS``), in configured order.
HookTable = Mapping[str, tuple[HookDefinition, ...]]


@dataclass(frozen=True, slots=True)
class Layer:
    """Selection/reasoning values one settings file sets (``None`` = not set there)."""

    provider: str | None = None
    model: str | None = None
    thinking_level: str | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated, merged view of both settings files."""

    global_layer: Layer = Layer()
    project_layer: Layer = Layer()
    fast: bool = False
    providers: Mapping[str, ProviderDefinition] = field(default_factory=dict)
    mcp_servers: Mapping[str, McpServerDefinition] = field(default_factory=dict)
    disabled_models: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Proxy and CA for outgoing HTTP, per key a trusted project's over global.
    network: NetworkSettings = field(default_factory=NetworkSettings)
    # Hooks of each file, kept apart (the global ones run first); the project's are empty
    # unless the project is trusted, as are its mcp_servers and network (TRUST_GATED).
    global_hooks: HookTable = field(default_factory=dict)
    project_hooks: HookTable = field(default_factory=dict)
    # Global only: absolute project directories whose own TRUST_GATED keys are used.
    trusted_projects: tuple[str, ...] = ()
    # The TRUST_GATED keys the project file sets but an untrusted project does not get.
    ignored_project_keys: tuple[str, ...] = ()
    # Policy, rules and deadline of tool-call approvals (config.approvals).
    approvals: ApprovalSettings = ApprovalSettings()
    # Where shell and hook commands run (tools.sandbox): the stricter of both files' level,
    # and the host network only when neither file turns it off.
    sandbox: str = SANDBOX_LEVELS[0]
    sandbox_network: bool = False

    @property
    def configured_thinking_level(self) -> str:
        return self.project_layer.thinking_level or self.global_layer.thinking_level or "default"


def settings_path(ctx: LaunchContext, scope: Scope) -> Path:
    """The file a scope names (lexical: what identifies it, not what is opened)."""
    return ctx.global_settings_path if scope is Scope.GLOBAL else ctx.project_settings_path


def project_settings_path(ctx: LaunchContext) -> Path | None:
    """The project's settings file as it is read, written and locked, or None when the
    project's ``.magi-code`` leads out of the project (a symlink to ``$MC_HOME`` or to
    another directory): then the project has no settings layer, and project writes are
    refused. Blocking."""
    directory = inside_project(ctx.project_dir, PROJECT_CONFIG_DIR)
    if directory is None:
        _log_once(
            _outside_logged,
            ctx.project_dir,
            "the project's .magi-code directory leads out of the project: "
            "its settings and instructions are ignored",
        )
        return None
    return directory / "settings.json"


def read_document(path: Path, scope: Scope) -> dict[str, Any]:
    """Read and validate one settings file; missing means ``{}``.

    Raises:
        ServiceError: ``configuration_unavailable`` when the file is unreadable, too large,
            not a regular file, not a JSON object, or has an invalid known field. What is
            wrong (scope, line and column, or the field) goes to the log, never the wire.
    """
    document, problem = _parse_document(path, scope)
    if _reported.get(path) != problem:  # once per change, not on every request
        if len(_reported) >= MAX_REPORTED_FILES:
            _reported.clear()
        _reported[path] = problem
        if problem is not None:
            log.warning("the %s settings file is unusable: %s", scope.value, problem)
    if problem is not None:
        raise ServiceError(ErrorCode.CONFIGURATION_UNAVAILABLE)
    return document


def settings_problem(path: Path, scope: Scope) -> str | None:
    """What makes the settings file at ``path`` unusable (no path in it), or None."""
    return _parse_document(path, scope)[1]


def _parse_document(path: Path, scope: Scope) -> tuple[dict[str, Any], str | None]:
    try:
        # A symlinked settings file is read through (writes replace the link); a FIFO or
        # other special file at the path is refused without blocking.
        data = read_regular(path, MAX_SETTINGS_BYTES, follow_symlinks=True)
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"cannot be read ({exc.strerror or type(exc).__name__})"
    if len(data) > MAX_SETTINGS_BYTES:
        return {}, f"is larger than {MAX_SETTINGS_BYTES} bytes"
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return {}, f"is not valid JSON (line {exc.lineno}, column {exc.colno})"
    schema = SETTINGS_SCHEMA if scope is Scope.GLOBAL else project_schema()
    if not isinstance(document, dict):
        return {}, "is not a JSON object"
    if not is_valid(document, schema):
        return {}, _invalid_field(document, schema)
    # The schema's root type is object, so this is a dict.
    result: dict[str, Any] = document
    return result, None


def _invalid_field(document: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, value in document.items():
        if not is_valid(value, properties.get(key, extra)):
            return (
                f"field {key!r} has an invalid value"
                if key in properties
                else "has an unknown field"
            )
    return "does not match the settings schema"


def encode_document(document: Mapping[str, Any]) -> bytes:
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


def builtin_providers(ctx: LaunchContext) -> dict[str, ProviderDefinition]:
    """The two built-ins; their endpoints follow the launch environment's overrides."""
    return {
        "anthropic": ProviderDefinition(
            provider_id="anthropic",
            api="anthropic",
            base_url=ctx.env.get("ANTHROPIC_BASE_URL") or DEFAULT_ANTHROPIC_BASE_URL,
            credential="api_key",
        ),
        "openai-codex": ProviderDefinition(
            provider_id="openai-codex",
            api="openai-responses",
            base_url=ctx.env.get("MC_CODEX_BASE_URL") or DEFAULT_CODEX_BASE_URL,
            credential="oauth",
        ),
    }


def all_providers(ctx: LaunchContext, settings: Settings) -> dict[str, ProviderDefinition]:
    """Built-ins plus custom providers, sorted by ID.

    Custom IDs cannot shadow built-ins: the schema rejects such a document outright.
    """
    merged = {**settings.providers, **builtin_providers(ctx)}
    return dict(sorted(merged.items()))


def _layer(document: Mapping[str, Any]) -> Layer:
    layer = Layer(
        provider=document.get("provider"),
        model=document.get("model"),
        thinking_level=document.get("thinking_level"),
    )
    # A secret pasted into a selection field is never echoed back; refuse the file.
    for value in (layer.provider, layer.model):
        if value is not None and looks_secret(value):
            raise ServiceError(ErrorCode.CONFIGURATION_UNAVAILABLE)
    return layer


def _provider(provider_id: str, raw: Mapping[str, Any]) -> ProviderDefinition:
    models = raw.get("models")
    static = None
    if models is not None:
        static = tuple(
            StaticModel(
                model_id=item["id"],
                label=item.get("label"),
                context_window=item.get("context_window"),
                max_output_tokens=item.get("max_output_tokens"),
            )
            for item in models
        )
    api_key_env = raw.get("api_key_env")
    return ProviderDefinition(
        provider_id=provider_id,
        api=raw["api"],
        base_url=raw["base_url"],
        api_key_env=api_key_env,
        context_window=raw.get("context_window"),
        label=raw.get("label"),
        credential="env" if api_key_env is not None else "none",
        static_models=static,
    )


def _mcp_servers(document: Mapping[str, Any]) -> dict[str, McpServerDefinition]:
    return {
        name: McpServerDefinition(
            name=name,
            command=raw["command"],
            args=tuple(raw.get("args", ())),
            env=dict(raw.get("env", {})),
        )
        for name, raw in document.get("mcp_servers", {}).items()
    }


def _network(global_doc: Mapping[str, Any], project_doc: Mapping[str, Any]) -> NetworkSettings:
    merged = {**global_doc.get("network", {}), **project_doc.get("network", {})}
    return NetworkSettings(proxy=merged.get("proxy"), ca_file=merged.get("ca_file"))


def _hooks(document: Mapping[str, Any]) -> dict[str, tuple[HookDefinition, ...]]:
    table = document.get("hooks", {})
    return {
        event: tuple(
            HookDefinition(
                command=tuple(raw["command"]),
                matcher=raw.get("matcher", "*"),
                timeout_ms=raw.get("timeout_ms", DEFAULT_HOOK_TIMEOUT_MS),
            )
            for raw in table[event]
        )
        for event in HOOK_EVENTS
        if table.get(event)
    }


def build_settings(
    global_doc: Mapping[str, Any], project_doc: Mapping[str, Any], *, trusted: bool = False
) -> Settings:
    """Merge two validated documents (project over global where both may set a key); the
    project's ``TRUST_GATED`` keys only when it is ``trusted``."""
    gated = project_doc if trusted else {}
    ignored = () if trusted else tuple(key for key in TRUST_GATED if key in project_doc)
    providers = {
        pid: _provider(pid, raw)
        for pid, raw in global_doc.get("providers", {}).items()
        if not looks_secret(pid)
    }
    disabled: dict[str, set[str]] = {}
    for document in (global_doc, project_doc):
        for pid, ids in document.get("disabled_models", {}).items():
            disabled.setdefault(pid, set()).update(ids)
    return Settings(
        global_layer=_layer(global_doc),
        project_layer=_layer(project_doc),
        fast=bool(global_doc.get("fast", False)),
        providers=providers,
        mcp_servers={**_mcp_servers(global_doc), **_mcp_servers(gated)},
        disabled_models={pid: frozenset(ids) for pid, ids in disabled.items()},
        network=_network(global_doc, gated),
        global_hooks=_hooks(global_doc),
        project_hooks=_hooks(gated),
        trusted_projects=tuple(global_doc.get("trusted_projects", ())),
        ignored_project_keys=ignored,
        approvals=build_approvals(global_doc, project_doc, trusted=trusted),
        # A project, trusted or not, can confine its commands more, never less.
        sandbox=max(
            global_doc.get("sandbox", SANDBOX_LEVELS[0]),
            project_doc.get("sandbox", SANDBOX_LEVELS[0]),
            key=SANDBOX_LEVELS.index,
        ),
        sandbox_network=bool(
            global_doc.get("sandbox_network", False) and project_doc.get("sandbox_network", True)
        ),
    )


def load_settings(ctx: LaunchContext) -> Settings:
    """Read both files and merge them.

    Raises:
        ServiceError: ``configuration_unavailable`` for any unreadable or invalid file.
    """
    global_doc = read_document(ctx.global_settings_path, Scope.GLOBAL)
    project = project_settings_path(ctx)
    project_doc = {} if project is None else read_document(project, Scope.PROJECT)
    # Also without gated keys: a trusted project may be offered "allow always" answers.
    trusted = is_trusted(global_doc.get("trusted_projects", ()), ctx.project_dir)
    if not trusted and any(key in project_doc for key in (*TRUST_GATED, *APPROVAL_KEYS)):
        _log_untrusted(ctx.project_dir)
    return build_settings(global_doc, project_doc, trusted=trusted)


def is_trusted(trusted_projects: Sequence[str], project_dir: Path) -> bool:
    """Whether ``project_dir`` is one of the listed directories (symlinks resolved on both
    sides; a subdirectory of a listed directory is not trusted)."""
    real = os.path.realpath(project_dir)
    return any(os.path.realpath(entry) == real for entry in trusted_projects)


def _log_untrusted(project_dir: Path) -> None:
    _log_once(
        _untrusted_logged,
        project_dir,
        "the project settings' hooks, mcp_servers, network and looser approval settings "
        "are ignored: "
        "the project is not in trusted_projects",
    )


def _log_once(logged: set[str], project_dir: Path, message: str) -> None:
    """``message`` (no path in it) once per project."""
    key = str(project_dir)
    if key in logged:
        return
    if len(logged) >= MAX_LOGGED_PROJECTS:
        logged.clear()
    logged.add(key)
    log.info(message)


# Receives the merged view and the target document, both re-read under the lock, and
# mutates the document in place (or raises ServiceError to abort without writing).
Mutation = Callable[[Settings, dict[str, Any]], None]


def update_settings(
    ctx: LaunchContext,
    scope: Scope,
    mutate: Mutation,
    verify: Callable[[Settings], None] | None = None,
) -> None:
    """The single settings writer: lock, re-read, mutate, validate, atomic replace.

    ``verify`` sees the merged view the write would produce and may raise to abort.

    A symlink at the settings path is replaced by a regular file, never written through.

    Raises:
        ServiceError: ``configuration_unavailable`` when the current files cannot be read;
            whatever ``mutate`` raises; ``settings_write_failed`` when the lock cannot be
            taken, the result is invalid, the write fails, or (project scope) the
            project's ``.magi-code`` leads out of the project.
    """
    project = project_settings_path(ctx)
    path = ctx.global_settings_path if scope is Scope.GLOBAL else project
    if path is None:
        raise ServiceError(ErrorCode.SETTINGS_WRITE_FAILED)
    schema = SETTINGS_SCHEMA if scope is Scope.GLOBAL else project_schema()
    try:
        with locked(path):
            global_doc = read_document(ctx.global_settings_path, Scope.GLOBAL)
            project_doc = {} if project is None else read_document(project, Scope.PROJECT)
            current = build_settings(global_doc, project_doc)
            document = global_doc if scope is Scope.GLOBAL else project_doc
            mutate(current, document)
            if not is_valid(document, schema):
                raise ServiceError(ErrorCode.SETTINGS_WRITE_FAILED)
            if verify is not None:
                verify(build_settings(global_doc, project_doc))
            data = encode_document(document)
            if len(data) > MAX_SETTINGS_BYTES:
                raise ServiceError(ErrorCode.SETTINGS_WRITE_FAILED)
            atomic_write(path, data, mode=SETTINGS_FILE_MODE)
    except OSError:
        # Includes filelock.Timeout (a TimeoutError) and permission/disk failures.
        raise ServiceError(ErrorCode.SETTINGS_WRITE_FAILED) from None
