"""Model-provider streaming over httpx (runtime layer).

Entry points: ``stream_response`` (one model response as neutral stream events) and
``list_models`` (discovery). Wire details per API live in ``anthropic``,
``openai_chat`` and ``openai_responses``; ``sse`` is the shared parser.
"""

from magi_code.providers.discovery import DiscoveredModel, list_models
from magi_code.providers.errors import FailureLabel, ProviderFailure, map_httpx_errors
from magi_code.providers.stream import (
    DEFAULT_SETTINGS,
    RetryPolicy,
    StreamSettings,
    build_call,
    stream_response,
)
from magi_code.providers.types import (
    API_KINDS,
    REASONING_LEVELS,
    ApiKind,
    AssistantText,
    Completed,
    ContinuityItem,
    ConversationItem,
    Endpoint,
    ProviderRequest,
    ReasoningLevel,
    ReasoningSummary,
    StopReason,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolSpec,
    UsageEvent,
    UserText,
)
from magi_code.providers.wire import MessageCache

__all__ = [
    "API_KINDS",
    "DEFAULT_SETTINGS",
    "REASONING_LEVELS",
    "ApiKind",
    "AssistantText",
    "Completed",
    "ContinuityItem",
    "ConversationItem",
    "DiscoveredModel",
    "Endpoint",
    "FailureLabel",
    "MessageCache",
    "ProviderFailure",
    "ProviderRequest",
    "ReasoningLevel",
    "ReasoningSummary",
    "RetryPolicy",
    "StopReason",
    "StreamEvent",
    "StreamSettings",
    "TextDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolResult",
    "ToolSpec",
    "UsageEvent",
    "UserText",
    "build_call",
    "list_models",
    "map_httpx_errors",
    "stream_response",
]
