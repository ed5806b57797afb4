"""The agent persists a streamed response in increments while it streams, and the
increments read back as the one message they were (against the loopback fake provider)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from magi_code.providers.types import AssistantText, Endpoint, UserText
from magi_code.sessions.records import AssistantRecord, TerminalRecord, ToolCallRecord, UserRecord
from magi_code.sessions.store import ContextRecord
from magi_code.tools.base import ToolContext
from magi_code.turns.agent import Agent, AgentEnv, AgentPlan
from magi_code.turns.context import items_from_records
from tests.support.fake_providers import FakeProviderServer, Reply


class Sink:
    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.records: list[dict[str, Any]] = []

    async def text(self, delta: str) -> None:
        self.deltas.append(delta)

    def activity(self, payload: dict[str, Any]) -> None:
        pass

    async def record(self, record: Mapping[str, Any]) -> int:
        await asyncio.sleep(0.005)  # a durable append takes a moment
        self.records.append(dict(record))
        return len(self.records)

    def assistant_texts(self) -> list[str]:
        return [r["text"] for r in self.records if r["type"] == "assistant"]


def agent_for(fake: FakeProviderServer, client: httpx.AsyncClient, sink: Sink, tmp: Path) -> Agent:
    plan = AgentPlan(
        endpoint=Endpoint("openai-chat", f"{fake.base_url}/v1", {}),
        model="m1",
        reasoning="default",
        fast=False,
        max_output_tokens=1024,
        context_window=128_000,
        system="system",
        cache_key="ses",
    )
    env = AgentEnv(client, plan, ToolContext(tmp, {}), sink, "turn_1", frozenset())
    return Agent(env, [])


async def test_a_slow_response_is_written_in_increments_that_read_back_as_one_message(
    fake: FakeProviderServer, tmp_path: Path
) -> None:
    chunks = [f"word{i} " for i in range(24)]
    fake.enqueue(Reply(text=chunks, chunk_delay=0.04))  # ~1 s: several 250 ms windows
    sink = Sink()
    async with httpx.AsyncClient() as client:
        answer = await agent_for(fake, client, sink, tmp_path).run([], "go")
    assert answer == "".join(chunks)
    assert [r["type"] for r in sink.records] == ["assistant"] * len(sink.records)
    assert 2 <= len(sink.records) <= 8
    assert "".join(sink.assistant_texts()) == answer
    records: list[ContextRecord] = [
        UserRecord(1, "turn_1", "go"),
        *(AssistantRecord(2 + i, "turn_1", t) for i, t in enumerate(sink.assistant_texts())),
    ]
    assert items_from_records(records) == [UserText("go"), AssistantText(answer)]


async def test_text_streamed_before_a_stall_is_durable_without_the_turn_ending(
    fake: FakeProviderServer, tmp_path: Path
) -> None:
    chunks = [f"part{i} " for i in range(6)]
    fake.enqueue(Reply(text=chunks, chunk_delay=0.01, ending="stall", after_chunks=6))
    sink = Sink()
    async with httpx.AsyncClient() as client:
        agent = agent_for(fake, client, sink, tmp_path)
        task = asyncio.create_task(agent.run([], "go"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while "".join(sink.assistant_texts()) != "".join(chunks):
            assert loop.time() < deadline, (sink.deltas, sink.records)
            await asyncio.sleep(0.02)
        assert "".join(sink.deltas) == "".join(chunks)
        # The provider still streams (stalled); the turn is cancelled and settles.
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await agent.settle_text()
    assert "".join(sink.assistant_texts()) == "".join(chunks)  # nothing written twice


def test_consecutive_assistant_records_of_one_turn_are_one_message() -> None:
    records: list[ContextRecord] = [
        UserRecord(1, "t1", "q1"),
        AssistantRecord(2, "t1", "Hel"),
        AssistantRecord(3, "t1", "lo"),
        ToolCallRecord(4, "t1", "c1", "shell", "{}"),
        AssistantRecord(6, "t1", "after the tool"),
        TerminalRecord(7, "t1", "completed", "Helloafter the tool"),
        UserRecord(8, "t2", "q2"),
        AssistantRecord(9, "t2", "a"),
        AssistantRecord(10, "t2", "b"),
    ]
    items = items_from_records(records)
    texts = [i.text for i in items if isinstance(i, AssistantText)]
    assert texts == ["Hello", "after the tool", "ab"]
