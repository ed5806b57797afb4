"""Usage that adds up: the turn's top-level ``provider_request`` usage plus its
``subagent_aggregate`` usage is exactly what the provider reported for every request
(each counted once), ``final_usage`` marks only the main agent's last request, and
parallel ``task`` calls of one reply are one ``subagent_batch`` whose tasks hang off their
tool calls. Through the real service, with scripted usage numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.process.agent_requests import posts
from tests.process.turn_support import APIS, run_turn, write_settings
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, FakeUsage, Reply
from tests.support.service import running_service


def _usage(n: int) -> FakeUsage:
    return FakeUsage(
        input_tokens=1000 * n, output_tokens=10 * n, cache_read_tokens=100 * n, reasoning_tokens=0
    )


def _task(call_id: str, prompt: str) -> FakeToolCall:
    return FakeToolCall(call_id, "task", json.dumps({"description": call_id, "prompt": prompt}))


@pytest.mark.parametrize("api", APIS)
async def test_usage_of_a_turn_with_parallel_subagents_adds_up_exactly(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    write_settings(home, fake, api)
    (project / "notes.txt").write_text("notes\n")
    fake.enqueue(
        Reply(
            text=["Delegating."],
            tool_calls=[_task("t-alpha", "child-alpha: read notes"), _task("t-beta", "child-beta")],
            usage=_usage(1),
        ),
        Reply(text=["Both done."], usage=_usage(5)),
    )
    # Each child is answered by its own route (they run concurrently).
    read = FakeToolCall("k1", "read_file", json.dumps({"path": "notes.txt"}))
    fake.route(
        "child-alpha",
        Reply(text=[], tool_calls=[read], usage=_usage(2)),
        Reply(text=["alpha answer"], usage=_usage(3)),
    )
    fake.route("child-beta", Reply(text=["beta answer"], usage=_usage(4)))
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "Delegate both")
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "Delegating.Both done."
    assert len(posts(fake)) == 5
    usage = turn.of_kind("usage")
    requests = [u for u in usage if u["source"] == "provider_request"]
    aggregates = [u for u in usage if u["source"] == "subagent_aggregate"]
    # The main agent's two requests; each child once, in its aggregate.
    assert [u["request_sequence"] for u in requests] == [1, 2]
    assert [u["final_usage"] for u in requests] == [False, True]
    assert len(aggregates) == 2 and not any(u["final_usage"] for u in aggregates)
    assert sorted(u["request_sequence"] for u in aggregates) == [1, 2]
    assert len({u["activity_id"] for u in usage}) == len(usage)
    for key, unit in (("effective_input", 1000), ("output", 10), ("cache_read", 100)):
        assert sum(u[key] for u in requests) == unit * (1 + 5), key
        assert sum(u[key] for u in aggregates) == unit * (2 + 3 + 4), key
        assert sum(u[key] for u in usage) == unit * (1 + 2 + 3 + 4 + 5), key
    assert all(u["cache_known"] for u in usage)
    # One batch; the two task calls belong to it; each task hangs off its tool call.
    lifecycle = turn.of_kind("lifecycle")
    batches = [a for a in lifecycle if a["category"] == "subagent_batch"]
    assert len(batches) == 1 and batches[0]["status"] == "running"
    batch_id = batches[0]["activity_id"]
    finished = [a for a in lifecycle if a["activity_id"] == batch_id and a is not batches[0]]
    assert [(a["category"], a["status"]) for a in finished] == [("activity", "completed")]
    calls = [a for a in turn.of_kind("tool") if a["status"] == "running"]
    assert [a["tool_name"] for a in calls] == ["task", "task"]
    assert all(a["parent_activity_id"] == batch_id for a in turn.of_kind("tool"))
    tasks = [a for a in lifecycle if a["category"] == "subagent_task"]
    assert len(tasks) == 2
    assert {a["parent_activity_id"] for a in tasks} == {a["activity_id"] for a in calls}
    # Concurrent: both tasks started before either finished.
    task_ids = {a["activity_id"] for a in tasks}
    lifecycle_order = [(a["activity_id"], a["category"]) for a in lifecycle]
    started = [i for i, (_, category) in enumerate(lifecycle_order) if category == "subagent_task"]
    ended = [
        i
        for i, (aid, category) in enumerate(lifecycle_order)
        if aid in task_ids and category == "activity"
    ]
    assert max(started) < min(ended)
    # The child's tool is linked to its task only.
    child_tools = [a for a in lifecycle if a["category"] == "tool"]
    assert len(child_tools) == 1
    assert child_tools[0]["parent_activity_id"] in task_ids


async def test_final_usage_is_the_last_request_of_a_tool_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    call = FakeToolCall("l1", "list_files", json.dumps({"pattern": "*"}))
    fake.enqueue(
        Reply(text=[], tool_calls=[call], usage=_usage(1)), Reply(text=["ok"], usage=_usage(2))
    )
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "list")
    usage = turn.of_kind("usage")
    assert [(u["request_sequence"], u["final_usage"]) for u in usage] == [(1, False), (2, True)]
    assert sum(u["effective_input"] for u in usage) == 3000
    assert turn.of_kind("lifecycle") == []  # no subagent, no batch
