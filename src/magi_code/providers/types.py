"""Provider-neutral conversation items, requests and stream events.

Theory of operation: the turns layer keeps a conversation as an ordered sequence of
items; each wire module (``anthropic``, ``openai_chat``, ``openai_responses``) groups
them into its API's message shapes when building a request, and turns that API's SSE
events back into the neutral ``StreamEvent`` values below. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, get_args

import orjson

from magi_code.dataclass import dataclass, field

if TYPE_CHECKING:
    from magi_code.providers.wire import MessageCache

ApiKind: TypeAlias = Literal["openai-chat", "anthropic", "openai-responses"]
API_KINDS: Final[tuple[ApiKind, ...]] = get_args(ApiKind)

ReasoningLevel: TypeAlias = Literal["default", "low", "medium", "high", "x_high", "max"]
REASONING_LEVELS: Final[tuple[ReasoningLevel, ...]] = (
    "default",
    "low",
    "medium",
    "high",
    "x_high",
    "max",
)

StopReason: TypeAlias = Literal["end_turn", "tool_use", "max_tokens", "other"]


# -- conversation items ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserText:
    text: str


@dataclass(frozen=True, slots=True)
class AssistantText:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str
    """JSON text exactly as the model sent it (may be invalid JSON)."""


def complete_arguments(arguments: str) -> bool:
    """Whether a tool call's raw argument text is one whole JSON object.

    No proper prefix of a JSON object text is itself a JSON object (its closing brace
    comes last), so this tells a call the output-token limit cut from a finished one.
    """
    try:
        return isinstance(orjson.loads(arguments), dict)
    except orjson.JSONDecodeError:
        return False


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    name: str
    output: str
    is_error: bool


@dataclass(frozen=True, slots=True)
class ContinuityItem:
    """Opaque provider state that must be echoed back unchanged on later requests.

    Anthropic thinking/redacted_thinking blocks (with their signature) and Responses
    reasoning items (with ``encrypted_content``). ``payload`` is the JSON text of the
    block/item. It is both a stream event and a conversation item: keep it in the
    conversation where it arrived; request builders for other APIs skip it. It is never
    displayed and is not a verified reasoning summary.
    """

    api: ApiKind
    payload: str


ConversationItem: TypeAlias = UserText | AssistantText | ToolCall | ToolResult | ContinuityItem


# -- request -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, object]
    """JSON schema of the tool's arguments object."""


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    model: str
    system: str
    items: Sequence[ConversationItem]
    tools: Sequence[ToolSpec]
    reasoning: ReasoningLevel
    fast: bool
    max_output_tokens: int
    """Anthropic ``max_tokens`` and chat ``max_tokens`` (omitted when <= 0). The Responses
    API gets no output cap: the ChatGPT backend rejects ``max_output_tokens``."""
    cache_key: str | None = None
    """Stable per-conversation key: Responses ``prompt_cache_key``; ignored elsewhere."""
    message_cache: MessageCache | None = field(default=None, compare=False, repr=False)
    """The conversation's encoded messages, shared by its requests (``wire``)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    api: ApiKind
    base_url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    """Already holds authentication (resolved by the caller); never logged or surfaced."""

    def url(self, path: str) -> str:
        """Join ``path`` (starting with ``/``) onto the base URL without doubled slashes."""
        return self.base_url.rstrip("/") + path


# -- stream events -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningSummary:
    """A completed summary the provider itself marked as a reasoning summary.

    Only Responses ``reasoning_summary_text.done`` / reasoning ``output_item.done``
    summaries produce this; raw thinking or reasoning deltas never do.
    """

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """Token usage of one provider request (at most one per stream, before ``Completed``).

    ``input_tokens`` is the total prompt size including cached reads and cache writes;
    ``cache_read_tokens`` is the cached part of it when ``cache_known``.
    """

    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_known: bool
    reasoning_tokens: int | None


@dataclass(frozen=True, slots=True)
class Completed:
    """The end of a response. ``max_tokens``: the output-token limit ended it (the text may
    stop mid-sentence); a tool call the limit cut short is never emitted as a
    ``ToolCallEvent`` (decoders drop calls whose arguments are not a whole JSON object
    when the response ends this way), so every emitted call is safe to run."""

    stop_reason: StopReason


StreamEvent: TypeAlias = (
    TextDelta | ReasoningSummary | ToolCallEvent | UsageEvent | ContinuityItem | Completed
)
