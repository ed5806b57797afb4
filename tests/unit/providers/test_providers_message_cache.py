"""Property: with a ``MessageCache`` shared by a conversation's requests, every request
body is byte for byte the body built without one, in every wire API, however the
conversation grows, is replaced (a compaction) or changes its system prompt."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from provider_helpers import APIS, make_request

from magi_code.providers import (
    ApiKind,
    AssistantText,
    ContinuityItem,
    ConversationItem,
    Endpoint,
    MessageCache,
    ToolCall,
    ToolResult,
    UserText,
    build_call,
)

texts = st.sampled_from(["", "a", "long text " * 20, "ünïcode ✓"])
call_ids = st.sampled_from(["c1", "c2", "c3"])
items = st.one_of(
    st.builds(UserText, texts),
    st.builds(AssistantText, texts),
    st.builds(ToolCall, call_ids, st.just("list_dir"), st.sampled_from(['{"p":1}', "{", "[]"])),
    st.builds(ToolResult, call_ids, st.just("list_dir"), texts, st.booleans()),
    st.builds(
        ContinuityItem,
        st.sampled_from(["anthropic", "openai-responses", "openai-chat"]),
        st.sampled_from(
            [
                '{"type":"thinking","thinking":"t","signature":"s"}',
                '{"type":"redacted_thinking","data":"d"}',
                '{"type":"reasoning","summary":[],"encrypted_content":"e"}',
                "not json",
            ]
        ),
    ),
)
# One request's change to the conversation: items appended, or the whole conversation
# replaced (a compaction), and the system prompt the request goes with.
steps = st.tuples(
    st.lists(items, max_size=6), st.booleans(), st.sampled_from(["You are a test.", "", "S2"])
)


def body(api: ApiKind, conversation: list[ConversationItem], system: str, cache: object) -> bytes:
    request = make_request(conversation, system=system, message_cache=cache)
    return orjson.dumps(build_call(Endpoint(api, "http://127.0.0.1:1", {}), request).body)


@pytest.mark.parametrize("api", APIS)
@given(st.lists(steps, min_size=1, max_size=8))
def test_bodies_with_the_cache_are_the_bodies_without_it(
    api: ApiKind, requests: list[tuple[list[ConversationItem], bool, str]]
) -> None:
    cache = MessageCache()
    conversation: list[ConversationItem] = []
    for added, replaced, system in requests:
        # Each request gets its own list, as the agent's do; the items are the same objects.
        conversation = added if replaced else [*conversation, *added]
        assert body(api, conversation, system, cache) == body(api, conversation, system, None)
