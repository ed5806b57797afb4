"""Compaction that keeps turns alive: mid-turn when the next request would cross the
threshold, after a provider's context-length error (with one retry), and at admission
when the history starts before the readable window; ``compaction_required`` when it
cannot be done. Through the real service, against the loopback fake provider (summary
requests are answered through a route keyed by the summary prompt)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from magi_code.protocol.limits import MAX_SESSION_REPLAY_WINDOW_BYTES
from magi_code.sessions.records import CompactionRecord, TerminalRecord, ToolCallRecord
from magi_code.sessions.store import SessionStore
from magi_code.turns.context import COMPACTION_THRESHOLD, EARLIER_NOTE, SUMMARY_PROMPT
from magi_code.turns.failures import REMEDIES
from tests.process.agent_requests import messages, posts, records, system_text
from tests.process.turn_support import (
    APIS,
    TurnEvents,
    check_turn,
    conversation,
    replay_all,
    run_turn,
    start_turn,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, HttpError, Reply
from tests.support.service import ServiceProcess, running_service

TOO_LONG = HttpError(
    400,
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 250000 tokens > 200000 maximum",
        },
    },
)


def _summaries(fake: FakeProviderServer, *texts: str) -> None:
    fake.route(SUMMARY_PROMPT, *(Reply(text=[t]) for t in texts))


def _is_summary(request: Any) -> bool:
    return SUMMARY_PROMPT in request.body.decode()


def _compactions(turn: TurnEvents) -> list[list[str]]:
    """The status sequence of each compaction of the turn, in order."""
    runs: dict[str, list[str]] = {}
    for activity in turn.of_kind("compaction"):
        runs.setdefault(activity["activity_id"], []).append(activity["status"])
    return list(runs.values())


async def _failed_turn_label(svc: ServiceProcess, turn_id: str) -> str:
    await svc.close_stdin()
    assert await svc.wait() == 0
    stderr = await svc.stderr_text()
    lines = [line for line in stderr.splitlines() if f"turn {turn_id} failed:" in line]
    assert len(lines) == 1, stderr
    return lines[0].split(" failed: ")[1].split(" — ")[0]


# -- mid-turn ------------------------------------------------------------------------------

WINDOW = 12_000
ROUNDS = 30


@pytest.mark.parametrize("api", APIS)
async def test_a_long_tool_loop_compacts_mid_turn_and_completes(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    write_settings(home, fake, api, context_window=WINDOW)
    (project / "data.txt").write_text(
        "".join(f"line {i:04d} of the data file\n" for i in range(120))
    )
    for i in range(ROUNDS):
        call = FakeToolCall(f"read-{i:02d}", "read_file", json.dumps({"path": "data.txt"}))
        fake.enqueue(Reply(text=[], tool_calls=[call], measure_input=True))
    fake.enqueue(Reply(text=["All ", "done."], measure_input=True), Reply(text=["Next."]))
    _summaries(fake, *(f"SUMMARY-{i}" for i in range(ROUNDS)))
    async with running_service(home, project) as svc:
        accepted, turn = await run_turn(svc, "Read the data file thirty times")
        session_id = accepted["session_id"]
        replay = conversation(await replay_all(svc, session_id))
        _, after = await run_turn(svc, "Anything else?", session_id=session_id)
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "All done."
    tools = turn.of_kind("tool")
    assert [a["status"] for a in tools] == ["running", "completed"] * ROUNDS
    compactions = _compactions(turn)
    assert len(compactions) >= 2, compactions
    assert all(c == ["triggered", "running", "completed"] for c in compactions)
    for activity in turn.of_kind("compaction"):
        if activity["status"] == "triggered":
            assert activity["current_tokens"] >= WINDOW * COMPACTION_THRESHOLD
            assert activity["max_tokens"] == WINDOW
    sent = posts(fake)
    summaries = [r for r in sent if _is_summary(r)]
    main = [r for r in sent if not _is_summary(r)]
    assert len(summaries) == len(compactions)
    assert len(main) == ROUNDS + 2
    # Every request of the turn fit the window (the fake measures its body as tokens).
    assert all(len(r.body) // 4 < WINDOW for r in main[:-1])
    # After the last compaction the early tool calls are gone and the summary is there.
    last = main[ROUNDS]
    assert "read-00" not in last.body.decode()
    assert f"SUMMARY-{len(compactions) - 1}" in system_text(last)
    # Checkpoints in the session, each after the records it replaces.
    history = records(home, session_id)
    checkpoints = [r for r in history if isinstance(r, CompactionRecord)]
    assert [c.summary for c in checkpoints] == [f"SUMMARY-{i}" for i in range(len(compactions))]
    assert all(c.cutoff_seq < c.seq for c in checkpoints)
    assert [c.cutoff_seq for c in checkpoints] == sorted(c.cutoff_seq for c in checkpoints)
    assert len([r for r in history if isinstance(r, ToolCallRecord)]) == ROUNDS
    assert replay == [
        ("summary", f"SUMMARY-{len(compactions) - 1}"),
        ("message", "assistant", "All done."),
        ("terminal", "completed"),
    ]
    # The next turn starts after the checkpoint: its conversation opens with the note that
    # leads a history resumed mid-turn, then the later tool work and the answer.
    assert after.terminal["assistant_text"] == "Next."
    next_messages = messages(sent[-1])
    assert next_messages[0] == ("user", EARLIER_NOTE)
    assert next_messages[-2:] == [("assistant", "All done."), ("user", "Anything else?")]


async def test_a_failed_compaction_is_not_retried_before_every_request(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, context_window=300)  # every request is over the threshold
    for i in range(3):
        call = FakeToolCall(f"l{i}", "list_files", json.dumps({"pattern": "*"}))
        fake.enqueue(Reply(text=[], tool_calls=[call], measure_input=True))
    fake.enqueue(Reply(text=["Done anyway."], measure_input=True))
    fake.route(SUMMARY_PROMPT, HttpError(400))
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "List thrice")
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "Done anyway."
    assert _compactions(turn) == [["triggered", "running", "failed"]]
    sent = posts(fake)
    assert [_is_summary(r) for r in sent] == [False, True, False, False, False]


# -- context-length errors -----------------------------------------------------------------


async def test_a_context_length_error_is_answered_by_compaction_and_one_retry(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, "anthropic")
    fake.enqueue(Reply(text=["First answer"]), TOO_LONG, Reply(text=["After compaction"]))
    _summaries(fake, "SUMMARY-A")
    async with running_service(home, project) as svc:
        accepted, first = await run_turn(svc, "First question")
        session_id = accepted["session_id"]
        _, turn = await run_turn(svc, "Second question", session_id=session_id)
        replay = conversation(await replay_all(svc, session_id))
    assert first.of_kind("compaction") == []
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "After compaction"
    assert _compactions(turn) == [["triggered", "running", "completed"]]
    sent = posts(fake)
    assert len(sent) == 4
    assert _is_summary(sent[2]) and "First answer" in sent[2].body.decode()
    retry = sent[3]
    assert "SUMMARY-A" in system_text(retry)
    assert messages(retry) == [("user", "Second question")]
    assert replay == [
        ("summary", "SUMMARY-A"),
        ("message", "user", "Second question"),
        ("message", "assistant", "After compaction"),
        ("terminal", "completed"),
    ]


async def test_a_second_context_length_error_fails_the_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, "anthropic")
    fake.enqueue(Reply(text=["First answer"]), TOO_LONG, TOO_LONG)
    _summaries(fake, "SUMMARY-A")
    async with running_service(home, project) as svc:
        accepted, _ = await run_turn(svc, "First question")
        session_id = accepted["session_id"]
        _, turn = await run_turn(svc, "Second question", session_id=session_id)
        label = await _failed_turn_label(svc, turn.terminal["turn_id"])
    assert turn.terminal["status"] == "failed"
    assert label == "context_length_exceeded" and label in REMEDIES
    assert turn.terminal["failure"] == label
    assert _compactions(turn) == [["triggered", "running", "completed"]]
    assert len(posts(fake)) == 4  # first turn, error, summary, the one retry
    terminals = [r for r in records(home, session_id) if isinstance(r, TerminalRecord)]
    assert [t.status for t in terminals] == ["completed", "failed"]


async def test_compaction_required_when_the_summary_itself_does_not_fit(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, "openai-chat")
    fake.enqueue(Reply(text=["First answer"]), TOO_LONG)
    fake.route(SUMMARY_PROMPT, TOO_LONG)
    async with running_service(home, project) as svc:
        accepted, _ = await run_turn(svc, "First question")
        session_id = accepted["session_id"]
        _, turn = await run_turn(svc, "Second question", session_id=session_id)
        replay = conversation(await replay_all(svc, session_id))
        label = await _failed_turn_label(svc, turn.terminal["turn_id"])
    # The v1 terminal status set is closed: the event says failed; the session says why.
    assert turn.terminal["status"] == "failed"
    assert label == "context_length_exceeded" == turn.terminal["failure"]
    assert _compactions(turn) == [["triggered", "running", "failed"]]
    assert len(posts(fake)) == 3  # no retry without a compaction
    terminals = [r for r in records(home, session_id) if isinstance(r, TerminalRecord)]
    assert [t.status for t in terminals] == ["completed", "compaction_required"]
    assert replay[-1] == ("terminal", "compaction_required")


# -- admission: history before the readable window -----------------------------------------


def _long_history(home: Path) -> str:
    """A session whose records the replay window holds only the end of (no checkpoint)."""
    store = SessionStore(home / "sessions")
    session_id = store.create()
    filler = "y" * 16_000
    count = MAX_SESSION_REPLAY_WINDOW_BYTES // len(filler) + 20
    with store.acquire_writer_lease(session_id) as lease:
        for i in range(count):
            turn_id = f"turn_old{i:04d}"
            lease.submit({"type": "user", "turn_id": turn_id, "text": f"old-question-{i} {filler}"})
            lease.submit({"type": "assistant", "turn_id": turn_id, "text": f"old-answer-{i}"})
            lease.submit(
                {
                    "type": "terminal",
                    "turn_id": turn_id,
                    "status": "completed",
                    "assistant_text": f"old-answer-{i}",
                }
            )
        lease.wait_durable(lease.submitted_seq)
    assert store.load_context(session_id).history_cut
    return session_id


async def test_a_history_longer_than_the_window_is_compacted_before_the_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    session_id = _long_history(home)
    fake.enqueue(Reply(text=["Fresh answer"]))
    _summaries(fake, "SUMMARY-OF-OLD")
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "New question", session_id=session_id)
        replay = conversation(await replay_all(svc, session_id))
    assert turn.terminal["status"] == "completed"
    assert _compactions(turn) == [["triggered", "running", "completed"]]
    summary, answer = posts(fake)
    assert _is_summary(summary)
    assert "old-answer-" in summary.body.decode()
    assert "SUMMARY-OF-OLD" in system_text(answer)
    assert messages(answer) == [("user", "New question")]
    assert replay == [
        ("summary", "SUMMARY-OF-OLD"),
        ("message", "user", "New question"),
        ("message", "assistant", "Fresh answer"),
        ("terminal", "completed"),
    ]


async def test_compaction_required_when_a_history_beyond_the_window_cannot_be_compacted(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    session_id = _long_history(home)
    fake.enqueue(Reply(text=["must not be asked"]))
    fake.route(SUMMARY_PROMPT, TOO_LONG)
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "New question", session_id=session_id)
        events = await svc.events_until_terminal(rid)
        turn = check_turn(events, accepted["turn_id"], session_id)
        label = await _failed_turn_label(svc, accepted["turn_id"])
    assert turn.terminal["status"] == "failed"
    assert label == "context_length_exceeded" == turn.terminal["failure"]
    assert _compactions(turn) == [["triggered", "running", "failed"]]
    sent = posts(fake)
    assert len(sent) == 1 and _is_summary(sent[0])  # the turn never sent the cut history
    last = records(home, session_id)[-1]
    assert isinstance(last, TerminalRecord)
    assert (last.turn_id, last.status) == (accepted["turn_id"], "compaction_required")
