"""Why a turn failed: one fixed label per cause, each with a one-line remedy.

A failed v1 ``turn.terminal`` carries both (``failure`` and ``remedy``, documented in
``docs/protocol/events.md``), and so does the session's terminal record; the label is in
v2 ``snapshot``/``attach`` answers (``failure``), and the line :func:`describe` makes goes
to the frontend's stderr (embedded mode, and the shim for the turns of its connection), to
``--prompt`` and, label only, to the log. Labels and remedies are fixed text: no provider
message, URL, path or secret ever reaches them; the one variable part is the name of a
custom provider's key variable (an identifier from settings, bounded, never one that
looks like a secret). ``docs/turns.md`` lists the table.
"""

from __future__ import annotations

from typing import Final

# Plain strings, importable without the runtime (the shim prints remedies): a unit test
# checks that every label the runtime can produce is here.
INTERNAL: Final = "internal_error"
STORAGE: Final = "storage_error"
PROVIDER_NOT_CONFIGURED: Final = "provider_not_configured"
OUTPUT_LIMIT: Final = "output_limit_exceeded"
REQUEST_LIMIT: Final = "request_limit_exceeded"
INTERRUPTED: Final = "service_interrupted"
CONTEXT_LENGTH: Final = "context_length_exceeded"
AUTH_MISSING: Final = "auth_missing"
AUTH_FAILED: Final = "provider_auth_failed"
SANDBOX_UNAVAILABLE: Final = "sandbox_unavailable"

# The wire bounds of ``failure`` and ``remedy`` (the schema and the terminal's size
# budget read these; a unit test holds every remedy to them).
MAX_LABEL_BYTES: Final = 64
MAX_REMEDY_BYTES: Final = 512

REMEDIES: Final[dict[str, str]] = {
    AUTH_MISSING: (
        "no credentials for the selected provider: set its key variable (ANTHROPIC_API_KEY "
        "for anthropic), or run `magi-code login`"
    ),
    "auth_refresh_failed": "the stored login could not be refreshed: run `magi-code login` again",
    "auth_unreadable": "the shared credential store cannot be read: run `magi-code doctor`",
    PROVIDER_NOT_CONFIGURED: (
        "the selected provider is not defined: run `magi-code doctor` to see the defined "
        "ones, then change `provider` or define it under `providers` in settings"
    ),
    "configuration_unavailable": (
        "a settings file is unusable: run `magi-code doctor` to see which and where"
    ),
    AUTH_FAILED: (
        "the provider refused the credentials: check the key, or run `magi-code login` again"
    ),
    "provider_http_error": (
        "the provider rejected the request: check the model ID, the base_url and the proxy settings"
    ),
    "provider_server_error": (
        "the provider answered with a server error, also when asked again: retry later"
    ),
    "provider_rate_limited": "the provider is rate-limiting this account: retry later",
    "provider_quota_exceeded": (
        "the account's quota or credit is used up: check the plan with the provider"
    ),
    "provider_unavailable": (
        "the provider could not be reached: check the network, proxy variables and base_url"
    ),
    "provider_timeout": "the provider did not answer in time: retry, or check the network",
    "provider_stream_error": "the provider's stream broke off: retry",
    "provider_incomplete": "the provider ended the reply early: retry",
    CONTEXT_LENGTH: (
        "the conversation no longer fits the model's context window: start a new session "
        "or choose a model with a larger window"
    ),
    SANDBOX_UNAVAILABLE: (
        "the settings ask for the workspace_write sandbox, which cannot start here (it needs "
        "Linux with user namespaces and bubblewrap): run `magi-code doctor` to see why, or "
        "set `sandbox` to `none`"
    ),
    OUTPUT_LIMIT: "the reply outgrew one turn's output bound: ask for a shorter answer",
    REQUEST_LIMIT: ("the agent used up one turn's provider requests: continue in a new turn"),
    INTERRUPTED: "the service stopped during the turn (killed or crashed): retry the prompt",
    STORAGE: "the session could not be written: check free disk space and MC_HOME",
    INTERNAL: "an internal error: see the service log (`magi-code daemon status` shows where)",
}
# Every label, in the table's order (the wire schema's enumeration).
LABELS: Final = tuple(REMEDIES)


def _credential_steps(provider_id: str, key_variable: str | None) -> tuple[str, str]:
    """(what gives the provider credentials, what to check when it refused them)."""
    # Imported here: the shim imports this module for describe() alone.
    from magi_code.auth.tokens import ANTHROPIC_PROVIDER_ID, CODEX_PROVIDER_ID
    from magi_code.config.ids import looks_secret

    if provider_id == ANTHROPIC_PROVIDER_ID:
        login = "run `magi-code login --provider anthropic`"
        return f"set ANTHROPIC_API_KEY, or {login}", f"check ANTHROPIC_API_KEY, or {login}"
    if provider_id == CODEX_PROVIDER_ID:
        login = "run `magi-code login --provider openai-codex`"
        return login, f"{login} again"
    if not key_variable:
        step = "name the variable holding its key with `api_key_env` under `providers` in settings"
        return step, step
    # A name that looks like a key most likely is the key, pasted there by mistake.
    name = "the variable its `api_key_env` names" if looks_secret(key_variable) else key_variable
    return f"set {name} in the frontend's environment", f"check the key in {name}"


def credential_step(provider_id: str, key_variable: str | None) -> str:
    """What gives a provider credentials, as a CLI step (remedies, ``magi-code doctor``).

    ``key_variable``: a custom provider's ``api_key_env`` (None without one).
    """
    return _credential_steps(provider_id, key_variable)[0]


def remedy(label: str, provider_id: str | None = None, key_variable: str | None = None) -> str:
    """The remedy for ``label``. With the turn's provider, a credential failure names what
    gives that provider credentials (its key variable, or the login that does)."""
    if provider_id is not None:
        if label == AUTH_MISSING:
            step = credential_step(provider_id, key_variable)
            return f"no credentials for the selected provider: {step}"
        if label == AUTH_FAILED:
            check = _credential_steps(provider_id, key_variable)[1]
            return f"the provider refused the credentials: {check}"
    return REMEDIES.get(label, REMEDIES[INTERNAL])


def describe(turn_id: str, label: str, remedy_text: str | None = None) -> str:
    """``turn <turn_id> failed: <label> — <remedy>`` (one line, no secrets); the table's
    remedy for ``label`` unless ``remedy_text`` gives the turn's own."""
    text = remedy_text if remedy_text is not None else remedy(label)
    return f"turn {turn_id} failed: {label} — {text}"
