"""The allowlisted ``turn.activity`` projection: the only place activity payloads are built.

Every builder takes runtime facts and returns the flattened ``activity`` object with
exactly the documented fields. Runtime names (tools, MCP servers, call IDs) only ever
leave here as namespace-prefixed SHA-256 identities; a tool's plain name appears only when
it is an allowlisted built-in. Arguments, results, commands, labels and provider text are
never accepted as inputs, so they cannot leak.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Final, Literal

from magi_code.protocol.limits import MAX_SUMMARY_BYTES
from magi_code.protocol.text import redact_secrets, truncate_utf8, without_hidden

# The v1 reasoning summary bounds: above this input size the text is omitted entirely.
SUMMARY_INPUT_LIMIT: Final = 16384

LifecycleStatus = Literal["queued", "running", "writing", "completed", "failed", "cancelled"]
LifecycleCategory = Literal[
    "tool",
    "hook",
    "context_injection",
    "subagent_batch",
    "subagent_task",
    "assistant",
    "diagnostic",
    "compaction",
]
ContextSource = Literal[
    "fallback_estimate",
    "tokenizer_estimate",
    "fallback_projection",
    "tokenizer_projection",
    "last_provider_usage",
    "provider_exact",
    "provider_partial",
]
UsageSource = Literal["provider_request", "subagent_aggregate"]
CompactionStatus = Literal["triggered", "running", "completed", "failed", "cancelled"]


def identity(namespace: str, *parts: str) -> str:
    """``<namespace>:<sha256 hex>`` of the parts; stable, opaque, never the raw name."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{namespace}:{digest}"


@functools.lru_cache(maxsize=1024)  # two events a call, from a few tools
def _tool_identity(server_name: str, tool_name: str) -> str:
    return identity("tool", server_name, tool_name)


def lifecycle(
    activity_id: str,
    category: LifecycleCategory | Literal["activity"],
    status: LifecycleStatus,
    parent_activity_id: str | None = None,
) -> dict[str, Any]:
    activity: dict[str, Any] = {
        "activity_id": activity_id,
        "kind": "lifecycle",
        "category": category,
        "status": status,
        "details_omitted": True,
    }
    if parent_activity_id is not None:
        activity["parent_activity_id"] = parent_activity_id
    return activity


def tool(
    activity_id: str,
    *,
    tool_name: str,
    builtin_names: frozenset[str],
    server_name: str | None,
    status: LifecycleStatus,
    timed_out: bool | None,
    parent_activity_id: str | None = None,
) -> dict[str, Any]:
    """A main-agent tool call; ``parent_activity_id`` is its ``subagent_batch``, if any."""
    activity: dict[str, Any] = {
        "activity_id": activity_id,
        "kind": "tool",
        "tool_id": _tool_identity(server_name or "", tool_name),
        "tool_name": tool_name if server_name is None and tool_name in builtin_names else None,
        "server_id": identity("mcp-server", server_name) if server_name is not None else None,
        "transport": "mcp" if server_name is not None else "local",
        "status": status,
        "timed_out": timed_out,
        "details_omitted": True,
    }
    if parent_activity_id is not None:
        activity["parent_activity_id"] = parent_activity_id
    return activity


def context(
    activity_id: str,
    *,
    current_tokens: int,
    max_tokens: int,
    reasoning_tokens: int | None,
    request_sequence: int,
    source: ContextSource,
) -> dict[str, Any]:
    return {
        "activity_id": activity_id,
        "kind": "context",
        "current_tokens": max(0, current_tokens),
        "max_tokens": max(0, max_tokens),
        "reasoning_tokens": reasoning_tokens,
        "request_sequence": request_sequence,
        "source": source,
    }


def usage(
    activity_id: str,
    *,
    effective_input: int,
    output: int,
    cache_read: int,
    cache_known: bool,
    request_sequence: int,
    final_usage: bool,
    source: UsageSource,
) -> dict[str, Any]:
    return {
        "activity_id": activity_id,
        "kind": "usage",
        "effective_input": max(0, effective_input),
        "output": max(0, output),
        "cache_read": max(0, cache_read),
        "cache_known": cache_known,
        "request_sequence": request_sequence,
        "final_usage": final_usage,
        "source": source,
    }


def compaction(
    activity_id: str,
    status: CompactionStatus,
    current_tokens: int | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    counted = status in ("triggered", "completed")
    return {
        "activity_id": activity_id,
        "kind": "compaction",
        "status": status,
        "current_tokens": current_tokens if counted else None,
        "max_tokens": max_tokens if counted else None,
        "replay_required": status in ("completed", "failed", "cancelled"),
    }


def sanitize_display(text: str) -> tuple[str, bool]:
    """Remove hidden characters and redact secret-looking spans; report if it changed."""
    cleaned = redact_secrets(without_hidden(text, keep="\n\t"))
    return cleaned, cleaned != text


def reasoning_summary(activity_id: str, provider_summary: str) -> dict[str, Any]:
    """Only for summaries the provider marked as verified reasoning summaries."""
    if len(provider_summary.encode("utf-8", "surrogatepass")) > SUMMARY_INPUT_LIMIT:
        text, redacted, truncated = "", False, True
    else:
        text, redacted = sanitize_display(provider_summary)
        text, truncated = truncate_utf8(text, MAX_SUMMARY_BYTES)
    return {
        "activity_id": activity_id,
        "kind": "reasoning_summary",
        "text": text,
        "redacted": redacted,
        "truncated": truncated,
    }
