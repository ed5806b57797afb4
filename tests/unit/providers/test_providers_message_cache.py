"""Property: with a ``MessageCache`` shared by a conversation's requests, every request
body is byte for byte the body built without one, in every wire API, however the
conversation grows, is replaced (a compaction) or changes its system prompt."""

from __future__ import annotations

import tracemalloc

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
from magi_code.providers.wire import BLOCK_BYTES, MARKS_REACH

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
    return b"".join(build_call(Endpoint(api, "http://127.0.0.1:1", {}), request).content())


# Blocks of one message each, of a few messages (a request's cut falls inside one), and
# the default (every block still being filled).
@pytest.mark.parametrize("block_bytes", [1, 100, BLOCK_BYTES])
@pytest.mark.parametrize("api", APIS)
@given(st.lists(steps, min_size=1, max_size=8))
def test_bodies_with_the_cache_are_the_bodies_without_it(
    api: ApiKind, block_bytes: int, requests: list[tuple[list[ConversationItem], bool, str]]
) -> None:
    cache = MessageCache(block_bytes)
    conversation: list[ConversationItem] = []
    for added, replaced, system in requests:
        # Each request gets its own list, as the agent's do; the items are the same objects.
        conversation = added if replaced else [*conversation, *added]
        assert body(api, conversation, system, cache) == body(api, conversation, system, None)


class Plain:
    """A builder of one message per item; remembers its instances."""

    made: list[Plain] = []

    def __init__(self) -> None:
        self.done: list[dict[str, object]] = []
        Plain.made.append(self)

    def add(self, item: ConversationItem) -> None:
        assert isinstance(item, UserText)
        # Taken as they are made: never all of a long conversation's at once.
        assert len(self.done) <= MARKS_REACH
        self.done.append({"role": "user", "content": item.text})

    def rest(self) -> list[dict[str, object]]:
        return []


def test_encoded_messages_are_kept_only_as_bytes() -> None:
    """A long conversation's messages, once encoded, leave the builder's list but for the
    last few that marks may change; every request still sends all of them, marked."""
    cache = MessageCache()
    conversation: list[ConversationItem] = []
    seen_by_marks: list[int] = []

    def last_marked(messages: list[dict[str, object]]) -> dict[int, dict[str, object]]:
        seen_by_marks.append(len(messages))
        return {len(messages) - 1: {**messages[-1], "mark": True}}

    for request in range(3):
        conversation = [*conversation, *(UserText(f"m{request}.{n}") for n in range(20))]
        sent = orjson.loads(b"".join(cache.array(conversation, Plain, (), last_marked).chunks))
        expected = [{"role": "user", "content": item.text} for item in conversation]
        expected[-1]["mark"] = True
        assert sent == expected
        assert len(Plain.made[-1].done) == MARKS_REACH
    assert len(Plain.made) == 1  # one builder for the whole conversation
    assert seen_by_marks == [MARKS_REACH] * 3


@pytest.mark.parametrize("api", APIS)
def test_a_request_sends_the_kept_messages_without_copying_them(api: ApiKind) -> None:
    """A tool loop's next request on a long conversation copies only what is new (and the
    last, unfinished block), not the conversation it already encoded, and sends the same
    bytes as without the cache."""
    endpoint = Endpoint(api, "http://127.0.0.1:1", {})
    cache = MessageCache()
    conversation: list[ConversationItem] = []
    for n in range(2000):
        conversation += [UserText(f"question {n} " * 40), AssistantText(f"answer {n} " * 40)]
    first = b"".join(
        build_call(endpoint, make_request(conversation, message_cache=cache)).content()
    )
    assert len(first) > 1_500_000
    conversation = [
        *conversation,
        ToolCall("c1", "list_dir", "{}"),
        ToolResult("c1", "list_dir", "ok", False),
    ]
    request = make_request(conversation, message_cache=cache)
    tracemalloc.start()
    try:
        content = build_call(endpoint, request).content()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * BLOCK_BYTES + 64 * 1024
    assert b"".join(content) == b"".join(build_call(endpoint, make_request(conversation)).content())


@pytest.mark.parametrize("api", APIS)
def test_a_short_request_is_one_chunk(api: ApiKind) -> None:
    """A body of at most a block goes as one write, cached messages and all."""
    endpoint = Endpoint(api, "http://127.0.0.1:1", {})
    conversation: list[ConversationItem] = [UserText("hi"), AssistantText("hello")]
    cached = build_call(endpoint, make_request(conversation, message_cache=MessageCache()))
    uncached = build_call(endpoint, make_request(conversation))

    assert cached.content() == uncached.content()
    assert len(cached.content()) == 1
