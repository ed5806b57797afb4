"""Conversation context: rebuilding it from session records, estimating its size, and
compacting it into a provider-written summary when it nears the model's window.

Thresholds (see ``docs/turns.md``): the agent compacts before a request whose estimated
size reaches ``COMPACTION_THRESHOLD`` (80%) of the model's window. The estimate is the
last provider usage of the turn (input + output tokens) plus the fallback estimate
(UTF-8 bytes / ``BYTES_PER_TOKEN``) of what was added since, or the fallback estimate of
the whole request when no usage is known yet. The summary request sends the
conversation as one transcript of at most ``SUMMARY_INPUT_SHARE`` (50%) of the window
(at least ``MIN_SUMMARY_INPUT_BYTES``), keeping its newest part, so it fits a window the
conversation itself no longer fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from magi_code.providers.stream import DEFAULT_SETTINGS, StreamSettings, stream_response
from magi_code.providers.types import (
    AssistantText,
    Completed,
    ConversationItem,
    Endpoint,
    ProviderRequest,
    TextDelta,
    ToolCall,
    ToolResult,
    UsageEvent,
    UserText,
)
from magi_code.sessions.records import (
    AssistantRecord,
    ToolCallRecord,
    ToolResultRecord,
    UserRecord,
)
from magi_code.sessions.store import ContextRecord

if TYPE_CHECKING:
    import httpx

# Rough bytes-per-token for the fallback estimate (no tokenizer is shipped).
BYTES_PER_TOKEN: Final = 4
# Compact when the estimate for the next request reaches this share of the window.
COMPACTION_THRESHOLD: Final = 0.8
# The summary request's transcript: at most this share of the window, at least this many
# bytes; each tool call's arguments and each tool result at most this many bytes in it.
SUMMARY_INPUT_SHARE: Final = 0.5
MIN_SUMMARY_INPUT_BYTES: Final = 8192
MAX_TRANSCRIPT_PART_BYTES: Final = 8192
SUMMARY_MAX_OUTPUT_TOKENS: Final = 4096
MAX_SUMMARY_CHARS: Final = 8000
UNFINISHED_TOOL_OUTPUT: Final = "The tool call did not finish (the turn was interrupted)."

SUMMARY_SYSTEM: Final = (
    "You write a compact summary of a coding-agent conversation so that it can continue "
    "without the full history. Keep decisions, file names, open tasks, and facts the user "
    "gave, the latest request and how far the work on it got. Reply with the summary only."
)
SUMMARY_PROMPT: Final = "Summarize the conversation above for your own later use."
# Sent after a compaction in the middle of a turn, in place of the conversation.
RESUME_PROMPT: Final = (
    "The conversation so far is summarized in the system prompt. Continue the current task "
    "from where it stopped."
)
# Leads a conversation whose first kept message is not the user's (after a checkpoint
# taken in the middle of a turn): every API wants the user to speak first.
EARLIER_NOTE: Final = "(The earlier conversation is summarized in the system prompt.)"
_OMITTED: Final = "[... the earlier part of the conversation is omitted ...]\n\n"


def items_from_records(records: Iterable[ContextRecord]) -> list[ConversationItem]:
    """Provider-neutral conversation from durable records (iterated more than once).

    A tool call without a durable result (the turn was cancelled mid-tool) gets an error
    result, since every provider requires a result for each call; a result whose call is
    not among the records (it lies before the window) is left out, as is an empty
    assistant record that continues nothing. Consecutive assistant records of one turn
    are the increments of one streamed response (or of a reply continued after the output
    limit): one message.
    """
    items: list[ConversationItem] = []
    answered = {r.call_id for r in records if isinstance(r, ToolResultRecord)}
    called = {r.call_id for r in records if isinstance(r, ToolCallRecord)}
    previous: ContextRecord | None = None
    for record in records:
        if isinstance(record, UserRecord):
            items.append(UserText(record.text))
        elif isinstance(record, AssistantRecord):
            last = items[-1] if items else None
            if (
                isinstance(previous, AssistantRecord)
                and previous.turn_id == record.turn_id
                and isinstance(last, AssistantText)
            ):
                items[-1] = AssistantText(last.text + record.text)
            elif record.text:
                items.append(AssistantText(record.text))
        elif isinstance(record, ToolCallRecord):
            items.append(ToolCall(record.call_id, record.name, record.arguments))
            if record.call_id not in answered:
                items.append(ToolResult(record.call_id, record.name, UNFINISHED_TOOL_OUTPUT, True))
        elif isinstance(record, ToolResultRecord) and record.call_id in called:
            items.append(ToolResult(record.call_id, record.name, record.output, record.is_error))
        previous = record
    return items


def leading_user(items: Sequence[ConversationItem]) -> list[ConversationItem]:
    """``items``, led by ``EARLIER_NOTE`` when they do not start with a user message."""
    if items and not isinstance(items[0], UserText):
        return [UserText(EARLIER_NOTE), *items]
    return list(items)


def _item_size(item: ConversationItem) -> int:
    if isinstance(item, (UserText, AssistantText)):
        return len(item.text.encode())
    if isinstance(item, ToolCall):
        return len(item.name) + len(item.arguments.encode())
    if isinstance(item, ToolResult):
        return len(item.output.encode())
    return len(item.payload)


def estimate_tokens(system: str, items: Sequence[ConversationItem]) -> int:
    """The fallback estimate: UTF-8 bytes / 4, plus 16 bytes of framing per item."""
    return (len(system.encode()) + _items_size(items)) // BYTES_PER_TOKEN


def _items_size(items: Sequence[ConversationItem]) -> int:
    return sum(_item_size(item) + 16 for item in items)


class GrowingEstimate:
    """``estimate_tokens`` of one conversation that grows at its end, as a tool loop's
    does: each call counts only the items added since the last one (without usage from
    the provider the whole conversation is estimated before every request).

    The items counted before are recognised by the last of them, still in its place; a
    conversation that shrank or was replaced (a compaction) is counted again in full. An
    item before the last is never replaced in place (the agent only appends, and a
    compaction replaces the whole list): that would go unnoticed.
    """

    __slots__ = ("_count", "_last", "_size")

    def __init__(self) -> None:
        self._count = 0
        self._size = 0
        self._last: ConversationItem | None = None

    def tokens(self, system: str, items: Sequence[ConversationItem]) -> int:
        count = self._count
        if count > len(items) or (count and items[count - 1] is not self._last):
            count = self._size = 0
        self._size += _items_size(items[count:])
        self._count = len(items)
        self._last = items[-1] if items else None
        return (len(system.encode()) + self._size) // BYTES_PER_TOKEN


def needs_compaction(tokens: int, context_window: int) -> bool:
    return context_window > 0 and tokens >= context_window * COMPACTION_THRESHOLD


def system_with_summary(system: str, summary: str | None) -> str:
    if not summary:
        return system
    return f"{system}\n\n# Summary of the earlier conversation\n\n{summary}"


def _clip(text: str, limit: int = MAX_TRANSCRIPT_PART_BYTES) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + " [...]"


def transcript(items: Sequence[ConversationItem], budget_bytes: int) -> str:
    """The conversation as plain text for the summary request, at most ``budget_bytes``
    (UTF-8) with its newest part kept. Plain text has none of the APIs' structural rules
    (who speaks first, every tool call answered), so any part of a conversation fits."""
    parts: list[str] = []
    for item in items:
        if isinstance(item, UserText):
            parts.append(f"[user]\n{item.text}")
        elif isinstance(item, AssistantText):
            parts.append(f"[assistant]\n{item.text}")
        elif isinstance(item, ToolCall):
            parts.append(f"[tool call: {item.name}]\n{_clip(item.arguments)}")
        elif isinstance(item, ToolResult):
            status = "tool error" if item.is_error else "tool result"
            parts.append(f"[{status}: {item.name}]\n{_clip(item.output)}")
    text = "\n\n".join(parts)
    data = text.encode("utf-8", "replace")
    if len(data) <= budget_bytes:
        return text
    keep = max(0, budget_bytes - len(_OMITTED.encode()))
    return _OMITTED + data[len(data) - keep :].decode("utf-8", "ignore")


def summary_budget(context_window: int) -> int:
    """Bytes of transcript one summary request may carry."""
    share = int(context_window * SUMMARY_INPUT_SHARE) * BYTES_PER_TOKEN
    return max(MIN_SUMMARY_INPUT_BYTES, share)


async def summarize(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    model: str,
    items: Sequence[ConversationItem],
    previous_summary: str | None,
    *,
    context_window: int,
    max_output_tokens: int = SUMMARY_MAX_OUTPUT_TOKENS,
    settings: StreamSettings = DEFAULT_SETTINGS,
) -> tuple[str, UsageEvent | None]:
    """Ask the provider for a summary of ``items`` (and any earlier summary); the summary
    (bounded to ``MAX_SUMMARY_CHARS``) and the request's usage, when reported.

    Raises:
        ProviderFailure: as ``stream_response``.
    """
    prompt = f"{transcript(items, summary_budget(context_window))}\n\n{SUMMARY_PROMPT}"
    request = ProviderRequest(
        model=model,
        system=system_with_summary(SUMMARY_SYSTEM, previous_summary),
        items=[UserText(prompt)],
        tools=[],
        reasoning="default",
        fast=False,
        max_output_tokens=min(SUMMARY_MAX_OUTPUT_TOKENS, max_output_tokens)
        if max_output_tokens > 0
        else SUMMARY_MAX_OUTPUT_TOKENS,
    )
    parts: list[str] = []
    usage: UsageEvent | None = None
    async for event in stream_response(client, endpoint, request, settings):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, UsageEvent):
            usage = event
        elif isinstance(event, Completed):
            break
    return "".join(parts)[:MAX_SUMMARY_CHARS], usage
