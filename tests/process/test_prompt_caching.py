"""Prompt caching through the real service: Anthropic ``cache_control`` breakpoints on
the system prompt, the last tool and the growing conversation prefix across a
multi-request tool turn; Responses ``prompt_cache_key`` per session; the usage activity's
cache fields as the provider reports them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tests.process.turn_support import builtin_env, run_turn
from tests.support.fake_providers import (
    FakeProviderServer,
    FakeToolCall,
    FakeUsage,
    RecordedRequest,
    Reply,
)
from tests.support.service import running_service

EPHEMERAL = {"type": "ephemeral"}


def _posts(fake: FakeProviderServer) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.method == "POST"]


def _marked_messages(body: dict[str, Any]) -> list[int]:
    """Indexes of the messages with a breakpoint (on their last cacheable block)."""
    marked = []
    for index, message in enumerate(body["messages"]):
        flags = [block.get("cache_control") for block in message["content"]]
        if EPHEMERAL in flags:
            # Exactly one block, and the newest one that can carry it.
            assert flags.count(EPHEMERAL) == 1, message
            assert message["content"][-1].get("cache_control") == EPHEMERAL, message
            marked.append(index)
    return marked


def _breakpoints(value: object) -> int:
    if isinstance(value, dict):
        own = 1 if value.get("cache_control") == EPHEMERAL else 0
        return own + sum(_breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(_breakpoints(v) for v in value)
    return 0


async def test_anthropic_breakpoints_follow_the_conversation_prefix(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    env = builtin_env(home, fake, "anthropic")
    (project / "notes.txt").write_text("alpha\nbeta\n")
    usage = FakeUsage(input_tokens=1000, output_tokens=20, cache_read_tokens=600)
    written = FakeUsage(input_tokens=1000, output_tokens=20, cache_read_tokens=0)
    fake.enqueue(
        Reply(
            text=["Reading."],
            tool_calls=[FakeToolCall("c1", "read_file", json.dumps({"path": "notes.txt"}))],
            usage=FakeUsage(1000, 20, 0, 0, cache_write_tokens=900),
        ),
        Reply(
            text=[],
            tool_calls=[
                FakeToolCall("c2", "grep", json.dumps({"pattern": "beta"})),
                FakeToolCall("c3", "list_files", json.dumps({"pattern": "*.txt"})),
            ],
            usage=usage,
        ),
        Reply(text=["Done."], usage=written),
    )
    async with running_service(home, project, env) as svc:
        _, turn = await run_turn(svc, "look at the notes")
        assert turn.terminal["status"] == "completed"
    bodies = [r.json for r in _posts(fake)]
    assert len(bodies) == 3
    for body in bodies:
        # System prompt and the last tool definition (only the last) carry a breakpoint.
        assert body["system"][-1]["cache_control"] == EPHEMERAL
        tools = body["tools"]
        assert tools[-1]["cache_control"] == EPHEMERAL
        assert all("cache_control" not in tool for tool in tools[:-1])
        assert _breakpoints(body) <= 4
    roles = [[m["role"] for m in body["messages"]] for body in bodies]
    assert roles == [
        ["user"],
        ["user", "assistant", "user"],
        ["user", "assistant", "user", "assistant", "user"],
    ]
    # Each request marks its last message (written for the next request) and the message
    # that ended the previous request (read from the cache the previous request wrote).
    assert [_marked_messages(body) for body in bodies] == [[0], [0, 2], [2, 4]]
    results = bodies[2]["messages"][4]["content"]
    assert [block["type"] for block in results] == ["tool_result", "tool_result"]
    # The grep worker process answered inside the service (uvloop) as well.
    assert results[0]["content"] == "notes.txt:2:beta"

    usages = turn.of_kind("usage")
    assert [(u["effective_input"], u["cache_read"], u["cache_known"]) for u in usages] == [
        (1000, 0, True),
        (1000, 600, True),
        (1000, 0, True),
    ]
    assert [u["request_sequence"] for u in usages] == [1, 2, 3]


async def test_responses_prompt_cache_key_is_per_session_and_not_the_session_id(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    env = builtin_env(home, fake, "openai-responses")
    fake.set_default(Reply(text=["ok"], usage=FakeUsage(500, 9, 384, 2)))
    async with running_service(home, project, env) as svc:
        first, turn = await run_turn(svc, "one")
        session = first["session_id"]
        await run_turn(svc, "two", session_id=session)
        other, _ = await run_turn(svc, "three")
    assert other["session_id"] != session
    keys = [r.json.get("prompt_cache_key") for r in _posts(fake)]
    assert len(keys) == 3
    assert all(isinstance(key, str) and key for key in keys)
    assert keys[0] == keys[1]
    assert keys[2] != keys[0]
    for key, session_id in zip(keys, (session, session, other["session_id"]), strict=True):
        assert session_id not in key
        assert hashlib.sha256(session_id.encode()).hexdigest() not in key
        assert len(key) <= 64
    usage = turn.of_kind("usage")
    assert [(u["effective_input"], u["cache_read"], u["cache_known"]) for u in usage] == [
        (500, 384, True)
    ]
