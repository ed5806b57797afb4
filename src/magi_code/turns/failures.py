"""Why a turn failed: one fixed label per cause, each with a one-line remedy.

The v1 ``turn.terminal`` payload has no reason by design; the label travels beside it:
to the frontend's stderr (embedded mode, and the shim for the turns of its connection),
to v2 ``snapshot``/``attach`` answers (``failure``), to ``--prompt`` and to the log.
Labels and remedies are fixed text: no provider message, URL, path or secret ever
reaches them. ``docs/turns.md`` lists the table.
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

REMEDIES: Final[dict[str, str]] = {
    "auth_missing": (
        "no credentials for the selected provider: set its key variable "
        "(ANTHROPIC_API_KEY for anthropic) or run `magi-code login`"
    ),
    "auth_refresh_failed": "the stored login could not be refreshed: run `magi-code login` again",
    "auth_unreadable": "the shared credential store cannot be read: run `magi-code doctor`",
    PROVIDER_NOT_CONFIGURED: (
        "the selected provider is not defined: choose another with config.set, or define "
        "it under `providers` in settings"
    ),
    "configuration_unavailable": (
        "a settings file is unusable: run `magi-code doctor` to see which and where"
    ),
    "provider_auth_failed": (
        "the provider refused the credentials: check the key, or run `magi-code login` again"
    ),
    "provider_http_error": (
        "the provider rejected the request: check the model ID, the base_url and the proxy settings"
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
    "context_length_exceeded": (
        "the conversation no longer fits the model's context window: start a new session "
        "or choose a model with a larger window"
    ),
    OUTPUT_LIMIT: "the reply outgrew one turn's output bound: ask for a shorter answer",
    REQUEST_LIMIT: ("the agent used up one turn's provider requests: continue in a new turn"),
    INTERRUPTED: "the service stopped during the turn (killed or crashed): retry the prompt",
    STORAGE: "the session could not be written: check free disk space and MC_HOME",
    INTERNAL: "an internal error: see the service log (`magi-code daemon status` shows where)",
}


def describe(turn_id: str, label: str) -> str:
    """``turn <turn_id> failed: <label> — <remedy>`` (one line, no secrets)."""
    return f"turn {turn_id} failed: {label} — {REMEDIES.get(label, REMEDIES[INTERNAL])}"
