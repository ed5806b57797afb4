"""A reply the provider's output-token limit cut is continued automatically (each API's
own stop signal: Anthropic ``max_tokens``, chat ``length``, Responses ``incomplete``), at
most three times; a tool call the limit cut is never run. Through the real service,
against the loopback fake provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from magi_code.sessions.records import AssistantRecord, ToolCallRecord
from magi_code.turns.agent import CONTINUE_PROMPT, MAX_CONTINUATIONS
from tests.process.agent_requests import messages, posts, records
from tests.process.turn_support import (
    APIS,
    conversation,
    replay_all,
    run_turn,
    tool_call,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.service import running_service


def _assistant_records(home: Path, session_id: str, turn_id: str) -> list[AssistantRecord]:
    return [
        r
        for r in records(home, session_id)
        if isinstance(r, AssistantRecord) and r.turn_id == turn_id
    ]


@pytest.mark.parametrize("api", APIS)
async def test_a_reply_cut_at_the_output_limit_is_continued_into_one_text(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    write_settings(home, fake, api)
    fake.enqueue(
        Reply(text=["The answer ", "starts here"], stop="max_tokens"),
        Reply(text=[" and ends", " here."]),
        Reply(text=["Next."]),
    )
    async with running_service(home, project) as svc:
        accepted, turn = await run_turn(svc, "Explain it")
        session_id = accepted["session_id"]
        replay = conversation(await replay_all(svc, session_id))
        _, after = await run_turn(svc, "And then?", session_id=session_id)
    full = "The answer starts here and ends here."
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == full
    sent = posts(fake)
    assert len(sent) == 3
    # The continuation sends the partial text back as the assistant's and asks to go on.
    assert messages(sent[1])[-2:] == [
        ("assistant", "The answer starts here"),
        ("user", CONTINUE_PROMPT),
    ]
    # Durable: one message, whole, not marked truncated; the next turn sends it whole.
    assert replay == [
        ("message", "user", "Explain it"),
        ("message", "assistant", full),
        ("terminal", "completed"),
    ]
    texts = _assistant_records(home, session_id, accepted["turn_id"])
    assert "".join(r.text for r in texts) == full
    assert not any(r.truncated for r in texts)
    assert messages(sent[2]) == [
        ("user", "Explain it"),
        ("assistant", full),
        ("user", "And then?"),
    ]
    assert after.terminal["assistant_text"] == "Next."
    # Only the request that ended the turn is final.
    assert [u["final_usage"] for u in turn.of_kind("usage")] == [False, True]


async def test_the_continuation_bound_ends_the_turn_with_its_text_marked_truncated(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    parts = [f"part{i} " for i in range(MAX_CONTINUATIONS + 2)]
    fake.enqueue(*(Reply(text=[p], stop="max_tokens") for p in parts))
    async with running_service(home, project) as svc:
        accepted, turn = await run_turn(svc, "Write a lot")
        replay = conversation(await replay_all(svc, accepted["session_id"]))
    expected = "".join(parts[: MAX_CONTINUATIONS + 1])
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == expected
    assert len(posts(fake)) == MAX_CONTINUATIONS + 1  # the last scripted reply is unused
    usage = turn.of_kind("usage")
    assert [u["final_usage"] for u in usage] == [False] * MAX_CONTINUATIONS + [True]
    texts = _assistant_records(home, accepted["session_id"], accepted["turn_id"])
    assert "".join(r.text for r in texts) == expected
    assert texts[-1].truncated and not any(r.truncated for r in texts[:-1])
    assert replay == [
        ("message", "user", "Write a lot"),
        ("message", "assistant", expected),
        ("terminal", "completed"),
    ]


@pytest.mark.parametrize("api", APIS)
async def test_a_tool_call_cut_at_the_output_limit_is_not_run(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    write_settings(home, fake, api)
    cut = FakeToolCall("c-cut", "shell", '{"command": "touch cut-marker.t')
    fake.enqueue(
        Reply(
            text=["Running both."],
            tool_calls=[tool_call("c-whole", "shell", command="echo whole > whole.txt"), cut],
            stop="max_tokens",
        ),
        Reply(
            text=[], tool_calls=[tool_call("c-again", "shell", command="echo again > again.txt")]
        ),
        Reply(text=["Finished."]),
    )
    async with running_service(home, project) as svc:
        accepted, turn = await run_turn(svc, "Run them")
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "Running both.Finished."
    assert (project / "whole.txt").read_text() == "whole\n"
    assert (project / "again.txt").read_text() == "again\n"
    assert not list(project.glob("cut-marker*"))
    # Two calls ran (running → completed each); the cut one left no trace.
    tools = turn.of_kind("tool")
    assert [a["status"] for a in tools] == ["running", "completed"] * 2
    calls = [
        r.call_id for r in records(home, accepted["session_id"]) if isinstance(r, ToolCallRecord)
    ]
    assert calls == ["c-whole", "c-again"]
    sent = posts(fake)
    assert len(sent) == 3
    assert messages(sent[1])[-1] == ("user", CONTINUE_PROMPT)
    assert "c-cut" not in sent[1].body.decode()
    assert "c-whole" in sent[1].body.decode()
