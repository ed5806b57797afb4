"""Conversation context: rebuilding it from session records, estimating its size, and
compacting it into a provider-written summary when it nears the model's window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import httpx

from magi_code.providers.stream import stream_response
from magi_code.providers.types import (
    AssistantText,
    Completed,
    ConversationItem,
    Endpoint,
    ProviderRequest,
    TextDelta,
    ToolCall,
    ToolResult,
    UserText,
)
from magi_code.sessions.records import (
    AssistantRecord,
    ToolCallRecord,
    ToolResultRecord,
    UserRecord,
)
from magi_code.sessions.store import ContextRecord

# Rough bytes-per-token for the fallback estimate (no tokenizer is shipped).
BYTES_PER_TOKEN: Final = 4
# Compact when the estimate for the next request reaches this share of the window.
COMPACTION_THRESHOLD: Final = 0.8
MAX_SUMMARY_CHARS: Final = 8000
UNFINISHED_TOOL_OUTPUT: Final = "The tool call did not finish (the turn was interrupted)."

SUMMARY_SYSTEM: Final = (
    "You write a compact summary of a coding-agent conversation so that it can continue "
    "without the full history. Keep decisions, file names, open tasks, and facts the user "
    "gave. Reply with the summary only."
)
SUMMARY_PROMPT: Final = "Summarize the conversation so far for your own later use."


def items_from_records(records: Sequence[ContextRecord]) -> list[ConversationItem]:
    """Provider-neutral conversation from durable records.

    A tool call without a durable result (the turn was cancelled mid-tool) gets an error
    result, since every provider requires a result for each call. Consecutive assistant
    records of one turn are the increments of one streamed response: one message.
    """
    items: list[ConversationItem] = []
    answered = {r.call_id for r in records if isinstance(r, ToolResultRecord)}
    previous: ContextRecord | None = None
    for record in records:
        if isinstance(record, UserRecord):
            items.append(UserText(record.text))
        elif isinstance(record, AssistantRecord):
            if isinstance(previous, AssistantRecord) and previous.turn_id == record.turn_id:
                last = items[-1]
                assert isinstance(last, AssistantText)
                items[-1] = AssistantText(last.text + record.text)
            else:
                items.append(AssistantText(record.text))
        elif isinstance(record, ToolCallRecord):
            items.append(ToolCall(record.call_id, record.name, record.arguments))
            if record.call_id not in answered:
                items.append(ToolResult(record.call_id, record.name, UNFINISHED_TOOL_OUTPUT, True))
        elif isinstance(record, ToolResultRecord):
            items.append(ToolResult(record.call_id, record.name, record.output, record.is_error))
        previous = record
    return items


def _item_size(item: ConversationItem) -> int:
    if isinstance(item, (UserText, AssistantText)):
        return len(item.text.encode())
    if isinstance(item, ToolCall):
        return len(item.name) + len(item.arguments.encode())
    if isinstance(item, ToolResult):
        return len(item.output.encode())
    return len(item.payload)


def estimate_tokens(system: str, items: Sequence[ConversationItem]) -> int:
    total = len(system.encode()) + sum(_item_size(item) + 16 for item in items)
    return total // BYTES_PER_TOKEN


def needs_compaction(tokens: int, context_window: int) -> bool:
    return context_window > 0 and tokens >= context_window * COMPACTION_THRESHOLD


def system_with_summary(system: str, summary: str | None) -> str:
    if not summary:
        return system
    return f"{system}\n\n# Summary of the earlier conversation\n\n{summary}"


async def summarize(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    model: str,
    items: Sequence[ConversationItem],
    previous_summary: str | None,
) -> str:
    """Ask the provider for a summary of ``items`` (and any earlier summary)."""
    request = ProviderRequest(
        model=model,
        system=system_with_summary(SUMMARY_SYSTEM, previous_summary),
        items=[*items, UserText(SUMMARY_PROMPT)],
        tools=[],
        reasoning="default",
        fast=False,
        max_output_tokens=4096,
    )
    parts: list[str] = []
    async for event in stream_response(client, endpoint, request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, Completed):
            break
    return "".join(parts)[:MAX_SUMMARY_CHARS]
