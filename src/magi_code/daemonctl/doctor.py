"""``magi-code doctor [--json] [--network]``: can a turn run here, and if not, why.

Each check is one :class:`Finding` (``ok``, ``warn`` or ``fail``) with a remedy for
anything that is not ``ok``. Nothing here starts a daemon; without ``--network`` nothing
leaves the machine and no file changes. ``--network`` makes one authenticated request,
the selected provider's model list with the credentials a turn would send: 401/403 fails
the check (the key or login was rejected), no answer fails it, another HTTP status warns
(the endpoint answered, the credentials were not confirmed). A Codex access token about
to expire is refreshed for it, as a turn would, which updates the credential store.

Messages are for the operator's terminal: they may name files, never secrets
(credential values are never read into a message, only whether they are present). Exit
status 0 only when no check failed, i.e. a turn could run with this environment, in
this directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from dataclasses import asdict
from typing import Any, Final, Literal

import orjson

from magi_code.auth.readiness import provider_status
from magi_code.auth.store import AuthStore
from magi_code.config.effective import resolve_effective
from magi_code.config.settings import (
    ProviderDefinition,
    Scope,
    Settings,
    all_providers,
    load_settings,
    settings_path,
    settings_problem,
)
from magi_code.dataclass import dataclass
from magi_code.endpoint.paths import UnsafeRuntimeDir, runtime_paths, verify_private_dir
from magi_code.protocol.errors import ServiceError
from magi_code.protocol.text import one_line
from magi_code.storage.launch import LaunchContext
from magi_code.tools.sandbox import bubblewrap
from magi_code.turns.failures import REMEDIES, SANDBOX_UNAVAILABLE, credential_step, remedy
from magi_code.turns.hooks import active_hooks
from magi_code.turns.skills import discover_skills
from magi_code.version import build_id, package_version

Status = Literal["ok", "warn", "fail"]
NETWORK_TIMEOUT_SECONDS: Final = 15.0
# Failures without an HTTP answer: the endpoint was not reached.
NO_ANSWER: Final = frozenset({"provider_unavailable", "provider_timeout", "provider_http_error"})
SUPPORTED_PLATFORMS: Final = ("linux", "darwin")
# A daemon past these is flagged: it idles near 100 MiB, and runs at most 64 turns.
DAEMON_RSS_LIMIT_BYTES: Final = 1024 * 1024 * 1024
DAEMON_CHILD_LIMIT: Final = 128


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    detail: str
    remedy: str = ""


def main(ctx: LaunchContext, *, as_json: bool, network: bool) -> int:
    findings = run_checks(ctx, network=network)
    ready = all(f.status != "fail" for f in findings)
    if as_json:
        document = {"turn_ready": ready, "checks": [asdict(f) for f in findings]}
        sys.stdout.write(orjson.dumps(document).decode() + "\n")
    else:
        for f in findings:
            line = f"{f.status:<5} {f.check:<12} {f.detail}"
            sys.stdout.write(line + (f"\n      {'':<12} → {f.remedy}" if f.remedy else "") + "\n")
        verdict = "a turn can run here" if ready else "a turn cannot run here yet"
        sys.stdout.write(f"magi-code doctor: {verdict}\n")
    return 0 if ready else 1


def run_checks(ctx: LaunchContext, *, network: bool) -> list[Finding]:
    findings = [_platform(), *_home(ctx), *_daemon(ctx)]
    settings_findings = _settings_files(ctx)
    findings.extend(settings_findings)
    if any(f.status == "fail" for f in settings_findings):
        return findings  # nothing below can be judged from unusable settings
    settings = load_settings(ctx)
    selection, provider = _selection(ctx, settings)
    findings.append(selection)
    findings.extend(_credentials(ctx, settings, provider))
    findings.extend(_mcp_servers(ctx, settings))
    findings.append(_hooks(settings))
    findings.append(_sandbox(settings))
    findings.append(_skills(ctx))
    if settings.ignored_project_keys:
        findings.append(_untrusted(settings.ignored_project_keys))
    if network and provider is not None:
        findings.append(_model_list(ctx, settings, provider))
    return findings


def _platform() -> Finding:
    version = ".".join(map(str, sys.version_info[:3]))
    detail = f"Python {version} on {sys.platform}, magi-code {package_version()}"
    if not sys.platform.startswith(SUPPORTED_PLATFORMS):
        return Finding("platform", "fail", detail, "magi-code runs on Linux and macOS only")
    return Finding("platform", "ok", detail)


def _home(ctx: LaunchContext) -> list[Finding]:
    home = ctx.mc_home
    try:
        info = os.stat(home)
    except FileNotFoundError:
        return [Finding("mc_home", "ok", f"{home} (created on first use)")]
    except OSError as exc:
        return [Finding("mc_home", "fail", f"{home}: {exc.strerror}", "fix MC_HOME or its parent")]
    if not stat.S_ISDIR(info.st_mode):
        return [Finding("mc_home", "fail", f"{home} is not a directory", "point MC_HOME elsewhere")]
    if not os.access(home, os.W_OK | os.X_OK):
        return [
            Finding(
                "mc_home",
                "fail",
                f"{home} is not writable",
                f"make it writable: chmod u+rwx {home}",
            )
        ]
    findings = [Finding("mc_home", "ok", str(home))]
    if info.st_mode & 0o077:
        findings.append(
            Finding(
                "mc_home",
                "warn",
                f"{home} is readable by other users (mode {stat.S_IMODE(info.st_mode):o})",
                f"chmod 700 {home}",
            )
        )
    try:
        paths = runtime_paths(ctx)
    except UnsafeRuntimeDir as exc:
        return [
            *findings,
            Finding(
                "runtime_dir", "fail", str(exc), "set MC_RUNTIME_DIR to a short private directory"
            ),
        ]
    for directory in (paths.state_dir, paths.socket_dir):
        if not directory.exists():
            continue
        try:
            verify_private_dir(directory)
        except UnsafeRuntimeDir as exc:
            findings.append(
                Finding("runtime_dir", "fail", str(exc), "fix the mode as the message says")
            )
    return findings


def _daemon(ctx: LaunchContext) -> list[Finding]:
    if ctx.env.get("MC_SERVICE_MODE") == "embedded":
        return [_daemon_state(None)]
    from .commands import query_daemon

    status = query_daemon(ctx)
    # An answering daemon reports its process figures (one of an older build may not).
    if "rss_bytes" not in status:
        return [_daemon_state(status)]
    return [_daemon_state(status), daemon_health(status)]


def _daemon_state(status: dict[str, Any] | None) -> Finding:
    if status is None:
        return Finding("daemon", "ok", "embedded mode (MC_SERVICE_MODE=embedded): no daemon used")
    if not status["running"]:
        if status.get("error"):
            return Finding(
                "daemon", "fail", f"not running: {status['error']}", "see `magi-code daemon status`"
            )
        return Finding("daemon", "ok", "not running (the first frontend starts it)")
    pid = status.get("pid")
    if status.get("responding") is False:
        return Finding(
            "daemon",
            "fail",
            f"pid {pid} holds the lock but does not answer ({status.get('error')})",
            f"resume it (kill -CONT {pid}) or end it; then `magi-code daemon status`",
        )
    detail = f"running: pid {pid}, version {status.get('version')}"
    if status.get("build_id") != build_id():
        return Finding(
            "daemon",
            "warn",
            f"{detail}, another build than this magi-code",
            "it is replaced once idle; `magi-code daemon restart` replaces it now",
        )
    return Finding("daemon", "ok", detail)


def daemon_health(status: dict[str, Any]) -> Finding:
    """Warn about a daemon over :data:`DAEMON_RSS_LIMIT_BYTES` resident memory, over
    :data:`DAEMON_CHILD_LIMIT` live children, or with a child it has not reaped."""
    rss, zombies = status["rss_bytes"], status["zombies"]
    children = sum(status["children"].values())
    detail = f"{rss // (1024 * 1024)} MiB resident, {children} child processes"
    over = []
    if rss > DAEMON_RSS_LIMIT_BYTES:
        over.append(f"over {DAEMON_RSS_LIMIT_BYTES // (1024 * 1024)} MiB")
    if children > DAEMON_CHILD_LIMIT:
        over.append(f"over {DAEMON_CHILD_LIMIT} children")
    if zombies:
        over.append(f"{zombies} unreaped (zombie) children")
    if not over:
        return Finding("daemon_health", "ok", detail)
    return Finding(
        "daemon_health",
        "warn",
        f"{detail}: {', '.join(over)}",
        "see `magi-code daemon status`; `magi-code daemon restart` replaces it once its turns end",
    )


def _settings_files(ctx: LaunchContext) -> list[Finding]:
    findings = []
    for scope in (Scope.GLOBAL, Scope.PROJECT):
        path = settings_path(ctx, scope)
        problem = settings_problem(path, scope)
        name = f"{scope.value} settings"
        if problem is not None:
            findings.append(
                Finding("settings", "fail", f"{name} {path} {problem}", "fix or move the file away")
            )
        elif path.exists():
            findings.append(Finding("settings", "ok", f"{name} {path}"))
    if not findings:
        findings.append(Finding("settings", "ok", "no settings files (defaults apply)"))
    return findings


def _selection(ctx: LaunchContext, settings: Settings) -> tuple[Finding, ProviderDefinition | None]:
    try:
        effective = resolve_effective(ctx, settings)
    except ServiceError:
        return (
            Finding(
                "selection",
                "fail",
                "MC_PROVIDER or MC_MODEL is not a valid ID",
                "unset them or use IDs made of letters, digits, '.', '_', '-'",
            ),
            None,
        )
    detail = f"provider {effective.provider_id}, model {effective.model_id}"
    if effective.provider is None:
        known = ", ".join(sorted(all_providers(ctx, settings)))
        return (
            Finding(
                "selection",
                "fail",
                f"{detail}: the provider is not defined",
                f"choose one of: {known}",
            ),
            None,
        )
    return Finding("selection", "ok", detail), effective.provider


def _credentials(
    ctx: LaunchContext, settings: Settings, selected: ProviderDefinition | None
) -> list[Finding]:
    try:
        snapshot = AuthStore(ctx.auth_path).read()
    except ServiceError:
        return [
            Finding(
                "credentials",
                "fail",
                "the credential store cannot be read",
                f"check {ctx.auth_path}",
            )
        ]
    providers = all_providers(ctx, settings)
    findings = []
    for entry in provider_status(ctx, providers.values(), snapshot, time.time()):
        provider = providers.get(entry["provider_id"])
        chosen = selected is not None and entry["provider_id"] == selected.provider_id
        detail = f"{entry['provider_id']}: {entry['readiness']} ({entry['source']})"
        if entry["ready"] or provider is None:
            findings.append(Finding("credentials", "ok" if entry["ready"] else "warn", detail))
        else:
            findings.append(
                Finding(
                    "credentials",
                    "fail" if chosen else "warn",
                    detail,
                    credential_step(provider.provider_id, provider.api_key_env),
                )
            )
    return findings


def _hooks(settings: Settings) -> Finding:
    # The hooks a turn in this project runs (the project's only when it is trusted), each
    # named by its program and when it runs: the event, and a tool matcher other than *.
    table = active_hooks(settings)
    if not table:
        return Finding("hooks", "ok", "none configured")
    shown = [
        f"{one_line(os.path.basename(hook.command[0]))} "
        f"({event}{'' if hook.matcher == '*' else ' ' + one_line(hook.matcher)})"
        for event, hooks in table.items()
        for hook in hooks
    ]
    return Finding("hooks", "ok", f"a turn here runs {len(shown)}: {', '.join(shown)}")


def _sandbox(settings: Settings) -> Finding:
    # What this process finds; a daemon started with another MC_BWRAP may differ
    # (`magi-code daemon status` shows the daemon's own answer).
    if settings.sandbox == "none":
        return Finding("sandbox", "ok", "none: shell and hook commands run unconfined")
    network = "with" if settings.sandbox_network else "without"
    found = bubblewrap()
    if found.path is None:
        detail = f"{settings.sandbox} is asked for, but {found.problem}"
        return Finding("sandbox", "fail", detail, REMEDIES[SANDBOX_UNAVAILABLE])
    return Finding("sandbox", "ok", f"{settings.sandbox} (bubblewrap), {network} network")


def _skills(ctx: LaunchContext) -> Finding:
    catalog = discover_skills(ctx.project_dir, ctx.mc_home)
    if not catalog:
        return Finding("skills", "ok", "none found")
    shown = ", ".join(f"{name} ({skill.scope})" for name, skill in catalog.skills.items())
    return Finding("skills", "ok", f"{len(catalog.skills)}: {shown}")


def _untrusted(keys: tuple[str, ...]) -> Finding:
    return Finding(
        "trust",
        "warn",
        f"the project settings' {', '.join(keys)} are ignored: the project is not trusted",
        "if you trust this project, add its directory to `trusted_projects` in the global settings",
    )


def _mcp_servers(ctx: LaunchContext, settings: Settings) -> list[Finding]:
    findings = []
    search = ctx.env.get("PATH", os.defpath)
    for name, server in sorted(settings.mcp_servers.items()):
        found = (
            shutil.which(server.command, path=search)
            if "/" not in server.command
            else (server.command if os.access(server.command, os.X_OK) else None)
        )
        if found is None:
            findings.append(
                Finding(
                    "mcp",
                    "warn",
                    f"server {name!r}: command {server.command!r} not found",
                    "install it or fix `mcp_servers` in settings (turns run without it)",
                )
            )
        else:
            findings.append(Finding("mcp", "ok", f"server {name!r}: {found}"))
    return findings


def _model_list(ctx: LaunchContext, settings: Settings, provider: ProviderDefinition) -> Finding:
    """One authenticated request: the provider's model list, with the credentials a turn
    would send, through the frontend's proxy/CA set-up (a Codex token about to expire is
    refreshed first, as for a turn)."""
    import asyncio

    from magi_code.auth.credentials import CredentialsError, resolve_headers
    from magi_code.providers.discovery import list_models
    from magi_code.providers.errors import ProviderFailure
    from magi_code.providers.http import build_client, transport_options
    from magi_code.providers.types import Endpoint

    name = provider.provider_id
    try:
        client = build_client(transport_options(ctx.env, settings.network))
    except ProviderFailure:
        return Finding(
            "network",
            "fail",
            "the proxy or CA settings are unusable",
            "check HTTPS_PROXY, SSL_CERT_FILE and `network` in settings",
        )

    async def probe() -> int:
        async with client:
            headers = await resolve_headers(ctx, provider, AuthStore(ctx.auth_path), client)
            endpoint = Endpoint(api=provider.api, base_url=provider.base_url, headers=headers)
            return len(await list_models(client, endpoint))

    try:
        count = asyncio.run(asyncio.wait_for(probe(), NETWORK_TIMEOUT_SECONDS))
    except CredentialsError as exc:
        why = remedy(exc.label, name, provider.api_key_env)
        return Finding("network", "fail", f"{name}: no request made ({exc.label})", why)
    except TimeoutError:
        return Finding(
            "network",
            "fail",
            f"{name}: no answer to the model list within {NETWORK_TIMEOUT_SECONDS:g} s",
            REMEDIES["provider_timeout"],
        )
    except ProviderFailure as exc:
        return _network_failure(provider, exc.label.value, exc.status)
    return Finding(
        "network", "ok", f"{name}: the credentials were accepted ({count} models listed)"
    )


def _network_failure(provider: ProviderDefinition, label: str, status: int | None) -> Finding:
    name = provider.provider_id
    if status in (401, 403):
        return Finding(
            "network",
            "fail",
            f"{name}: the provider rejected the credentials (HTTP {status})",
            f"replace them: {credential_step(provider.provider_id, provider.api_key_env)}",
        )
    if status is None and label in NO_ANSWER:
        return Finding(
            "network", "fail", f"{name}: cannot reach its endpoint ({label})", REMEDIES[label]
        )
    answered = f"HTTP {status}" if status is not None else "an unreadable listing"
    # Reached, and not refused; a quota is an account's, the rest may pass or be the list's.
    return Finding(
        "network",
        "fail" if label == "provider_quota_exceeded" else "warn",
        f"{name}: the model list request got {answered} ({label}); the credentials "
        "were not confirmed",
        REMEDIES.get(label, REMEDIES["provider_http_error"]),
    )
