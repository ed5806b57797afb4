"""Streamed turns through the real ``magi-code --app service`` process against loopback
providers: ordering, multi-turn history for all three APIs, replay (also after a
restart), cancellation, EOF, admission errors, provider failures and the output bound."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
import pytest

from tests.process.turn_support import (
    APIS,
    assert_no_leak,
    builtin_env,
    check_turn,
    conversation,
    delta_text_seen,
    read_until,
    replay_all,
    run_turn,
    start_turn,
    stdout_text,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, HttpError, Reply
from tests.support.service import ServiceProcess, running_service


def _user_texts(body: object) -> list[str]:
    """Every string in a provider request body (role/content shapes differ per API)."""
    out: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(body)
    return out


# -- ordering --------------------------------------------------------------------------


async def test_turn_events_are_ordered_and_terminal_text_is_the_deltas(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["Hel", "lo, ", "wor", "ld", " ✓"], chunk_delay=0.005))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "Say hello")
        assert accepted["turn_id"] and accepted["session_id"]
        events = await svc.events_until_terminal(rid)
        turn = check_turn(events, accepted["turn_id"], accepted["session_id"])
        assert turn.terminal["status"] == "completed"
        assert turn.terminal["assistant_text"] == "Hello, world ✓"
        assert len(turn.deltas) >= 1
        # Nothing at all follows the terminal for this request (not even an activity).
        status = await svc.request("status")
        assert status["error"] is None
        assert not [m for m in svc.pending if m.get("request_id") == rid]
        # The start request ID is released after the terminal: it can be reused.
        fake.enqueue(Reply(text=["x"]))
        await start_turn(svc, "again", request_id=rid, session_id=accepted["session_id"])
        again = await svc.events_until_terminal(rid)
        assert again[-1]["payload"]["assistant_text"] == "x"


# -- multi-turn conversations, history and replay ----------------------------------------


# Both modes for one API: a restart is a new process (embedded) or a new shim and daemon;
# the APIs' wire formats are the shared core's, once.
@pytest.mark.parametrize("api", [pytest.param(APIS[0], marks=pytest.mark.both_modes), *APIS[1:]])
async def test_multi_turn_conversation_sends_history_and_replays_after_restart(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    env = builtin_env(home, fake, api) if api != "openai-chat" else {}
    if api == "openai-chat":
        write_settings(home, fake, api)
    fake.enqueue(Reply(text=["First ", "answer"]), Reply(text=["Second ", "answer"]))
    async with running_service(home, project, env) as svc:
        accepted, first = await run_turn(svc, "first question")
        session_id = accepted["session_id"]
        assert first.terminal["status"] == "completed"
        assert first.terminal["assistant_text"] == "First answer"
        _, second = await run_turn(svc, "second question", session_id=session_id)
        assert second.terminal["assistant_text"] == "Second answer"
        expected = [
            ("message", "user", "first question"),
            ("message", "assistant", "First answer"),
            ("terminal", "completed"),
            ("message", "user", "second question"),
            ("message", "assistant", "Second answer"),
            ("terminal", "completed"),
        ]
        assert conversation(await replay_all(svc, session_id)) == expected
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 2
    second_strings = _user_texts(posts[1].json)
    for text in ("first question", "First answer", "second question"):
        assert text in second_strings, (api, text)
    assert "First answer" not in _user_texts(posts[0].json)
    if api == "anthropic":
        assert posts[0].headers["x-api-key"] == "sk-ant-test-key-0000"
    elif api == "openai-responses":
        assert posts[0].headers["authorization"].startswith("Bearer ")
        assert posts[0].headers["chatgpt-account-id"] == "acct-fake-1"

    # A new process over the same MC_HOME replays the same history and continues it.
    fake.enqueue(Reply(text=["Third"]))
    async with running_service(home, project, env) as svc:
        assert conversation(await replay_all(svc, session_id)) == expected
        _, third = await run_turn(svc, "third question", session_id=session_id)
        assert third.terminal["assistant_text"] == "Third"
    third_strings = _user_texts(fake.requests[-1].json)
    for text in ("first question", "Second answer", "third question"):
        assert text in third_strings


@pytest.mark.parametrize("api", APIS)
async def test_the_turns_of_a_service_share_one_provider_connection(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    # Each response is read to its end, so no request pays a new connection (over TLS, a
    # new handshake) because the previous one stopped reading at its terminal event.
    env = builtin_env(home, fake, api)
    call = FakeToolCall("c1", "list_files", '{"pattern": "*"}')
    fake.enqueue(Reply(text=[], tool_calls=[call]), Reply(text=["one"]), Reply(text=["two"]))
    async with running_service(home, project, env) as svc:
        accepted, first = await run_turn(svc, "first")
        assert first.terminal["assistant_text"] == "one"
        _, second = await run_turn(svc, "second", session_id=accepted["session_id"])
        assert second.terminal["assistant_text"] == "two"
    assert len([r for r in fake.requests if r.method == "POST"]) == 3
    assert fake.connections == 1


# -- cancellation and EOF ------------------------------------------------------------------


async def test_cancel_mid_stream_reaches_the_provider_and_keeps_the_partial_text(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["partial ", "text"], ending="stall"))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "long question")
        turn_id = accepted["turn_id"]
        # Wait until both chunks have been streamed to the client as deltas.
        await read_until(svc, lambda _: delta_text_seen(svc, rid) == "partial text")
        cancel = await svc.request("turn.cancel", {"turn_id": turn_id})
        assert cancel["error"] is None
        assert cancel["payload"] == {"turn_id": turn_id, "status": "cancellation_requested"}
        turn = check_turn(await svc.events_until_terminal(rid), turn_id, accepted["session_id"])
        assert turn.terminal["status"] == "cancelled"
        assert turn.terminal["assistant_text"] == "partial text"
        assert await asyncio.to_thread(fake.wait_for_disconnects, 1, 10.0)
        # The turn is finished: cancelling it again (or an unknown turn) is unknown_turn.
        again = await svc.request("turn.cancel", {"turn_id": turn_id})
        assert again["error"]["code"] == "unknown_turn"
        unknown = await svc.request("turn.cancel", {"turn_id": "turn_nope"})
        assert unknown["error"]["code"] == "unknown_turn"
        assert conversation(await replay_all(svc, accepted["session_id"])) == [
            ("message", "user", "long question"),
            ("message", "assistant", "partial text"),
            ("terminal", "cancelled"),
        ]


# Both modes: EOF is the stdio adapter's (embedded) or the shim's.
@pytest.mark.both_modes
async def test_eof_mid_stream_writes_a_cancelled_terminal_and_exits_zero(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["half"], ending="stall"))
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        rid, accepted = await start_turn(svc, "question")
        await read_until(svc, lambda _: delta_text_seen(svc, rid) == "half")
        await svc.close_stdin()
        rest = await svc.drain_stdout()
        turn = check_turn(
            [m for m in rest if m.get("request_id") == rid],
            accepted["turn_id"],
            accepted["session_id"],
        )
        assert turn.terminal["status"] == "cancelled"
        assert turn.terminal["assistant_text"] == "half"
        assert await svc.wait() == 0
    finally:
        await svc.stop()
    assert await asyncio.to_thread(fake.wait_for_disconnects, 1, 10.0)
    async with running_service(home, project) as again:
        assert conversation(await replay_all(again, accepted["session_id"])) == [
            ("message", "user", "question"),
            ("message", "assistant", "half"),
            ("terminal", "cancelled"),
        ]


# -- admission -----------------------------------------------------------------------------


# Both modes: a request ID is released when its answer is written (embedded) or acknowledged
# by the shim.
@pytest.mark.both_modes
async def test_duplicate_turn_request_id_is_refused_while_the_turn_runs(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["a", "b", "c", "d"], chunk_delay=0.1))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "question")
        duplicate = await svc.request(
            "turn.start", {"prompt": "other"}, request_id=rid, session_id=None
        )
        assert duplicate["error"]["code"] == "duplicate_request_id"
        assert duplicate["payload"] is None
        turn = check_turn(
            await svc.events_until_terminal(rid), accepted["turn_id"], accepted["session_id"]
        )
        assert turn.terminal["status"] == "completed"
        assert turn.terminal["assistant_text"] == "abcd"
    # The refused start reached no provider.
    assert len([r for r in fake.requests if r.method == "POST"]) == 1


async def test_turn_admission_errors(home: Path, project: Path, fake: FakeProviderServer) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["slow", " answer"], chunk_delay=0.3))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "question")
        session_id = accepted["session_id"]
        busy = await svc.request("turn.start", {"prompt": "more"}, session_id=session_id)
        assert busy["error"]["code"] == "session_busy"
        for payload in (
            {"prompt": "   \n\t"},
            {"prompt": ""},
            {"prompt": 5},
            {},
            {"prompt": "x", "options": {"model": "m2"}},
            {"prompt": "x", "options": None},
            {"prompt": "x", "extra": 1},
        ):
            bad = await svc.request("turn.start", payload)
            assert bad["error"]["code"] == "invalid_payload", payload
            assert bad["payload"] is None
        missing = await svc.request("turn.start", {"prompt": "x"}, session_id="sess_" + "0" * 24)
        assert missing["error"]["code"] == "session_unavailable"
        bad_id = await svc.request("turn.start", {"prompt": "x"}, session_id="../etc")
        assert bad_id["error"]["code"] in ("invalid_session_id", "invalid_request")
        bad_id = await svc.request("turn.start", {"prompt": "x"}, session_id="a b")
        assert bad_id["error"]["code"] in ("invalid_session_id", "invalid_request")
        turn = check_turn(await svc.events_until_terminal(rid), accepted["turn_id"], session_id)
        assert turn.terminal["status"] == "completed"
        # Rejected starts created no worker: no event of theirs ever appears.
        assert all(m["kind"] == "response" for m in svc.pending)
    assert len([r for r in fake.requests if r.method == "POST"]) == 1


# -- provider failures -----------------------------------------------------------------------


FAILURES: list[tuple[str, list[Reply | HttpError], str]] = [
    ("openai-chat", [HttpError(500, retry_after="0")] * 4, ""),
    ("anthropic", [HttpError(401)], ""),
    ("openai-responses", [HttpError(400)], ""),
    ("anthropic", [Reply(text=["so"], ending="malformed")], "so"),
    ("openai-responses", [Reply(text=["mid", "way"], ending="disconnect")], "midway"),
    ("openai-chat", [Reply(text=["mid", "cut"], ending="disconnect")], "midcut"),
    ("anthropic", [Reply(text=["err"], ending="error_event")], "err"),
    ("openai-responses", [Reply(text=["bad"], ending="error_event")], "bad"),
    ("openai-chat", [Reply(text=["cut"], ending="eof")], "cut"),
]


# Both modes: the failure is printed by the stdio adapter (embedded) or the shim.
@pytest.mark.both_modes
async def test_provider_failures_end_the_turn_failed_without_leaking(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """One process, one session; settings are re-read per turn, so each turn switches API."""
    svc = await ServiceProcess.start(home, project)
    session_id = None
    seen: list[dict[str, object]] = []
    expected: list[tuple[str, ...]] = []
    try:
        await svc.initialize()
        for api, replies, partial in FAILURES:
            write_settings(home, fake, api)
            fake.enqueue(*replies)
            rid, accepted = await start_turn(svc, f"question {api}", session_id=session_id)
            session_id = accepted["session_id"]
            events = await svc.events_until_terminal(rid)
            seen += events
            turn = check_turn(events, accepted["turn_id"], session_id)
            assert turn.terminal["status"] == "failed", (api, replies)
            assert turn.terminal["assistant_text"] == partial, (api, replies)
            expected.append(("message", "user", f"question {api}"))
            if partial:
                expected.append(("message", "assistant", partial))
            expected.append(("terminal", "failed"))
        assert session_id is not None
        assert conversation(await replay_all(svc, session_id)) == expected
        await svc.close_stdin()
        rest = await svc.drain_stdout()
        assert await svc.wait() == 0
        stderr = await svc.stderr_text()
    finally:
        await svc.stop()
    assert fake.requests[-1].method == "POST"
    assert_no_leak(stdout_text(seen + rest), fake.base_url)
    assert_no_leak(stderr, fake.base_url, "x-api-key", "authorization", "Authorization")


async def test_429_with_retry_after_before_the_first_token_is_retried(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(HttpError(429, retry_after="0"), HttpError(503), Reply(text=["ok"]))
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "question")
        assert turn.terminal["status"] == "completed"
        assert turn.terminal["assistant_text"] == "ok"
    assert len([r for r in fake.requests if r.method == "POST"]) == 3


async def test_output_beyond_the_terminal_bound_fails_with_the_accepted_text(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    chunk = "é" * 1000 + "z" * 1000  # 3000 bytes per chunk
    fake.enqueue(Reply(text=[chunk] * 12))  # 36,000 bytes > 16 KiB
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "write a lot")
        assert turn.terminal["status"] == "failed"
        accepted = turn.terminal["assistant_text"]
        assert 0 < len(accepted.encode()) <= 16384
        assert accepted == chunk * (len(accepted) // len(chunk))
        for message in turn.events:
            assert len(orjson.dumps(message)) + 1 <= 65536
            assert len(orjson.dumps(message["payload"])) <= 32768
        items = conversation(await replay_all(svc, turn.terminal["session_id"]))
        assert items[-1] == ("terminal", "failed")
        assert ("message", "assistant", accepted) in items


# Both modes: the terminal is settled when written (embedded) or acknowledged by the shim.
@pytest.mark.both_modes
async def test_next_turn_can_start_as_soon_as_the_terminal_is_read(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """Implicit attachment: the session is free the moment its terminal is delivered
    (no session_busy race with the worker's cleanup), over many back-to-back turns."""
    write_settings(home, fake)
    fake.set_default(Reply(text=["ok"]))
    async with running_service(home, project) as svc:
        accepted, _ = await run_turn(svc, "turn 0")
        session_id = accepted["session_id"]
        for i in range(1, 12):
            _, turn = await run_turn(svc, f"turn {i}", session_id=session_id)
            assert turn.terminal["status"] == "completed"
        opened = await svc.request("session.open", session_id=session_id)
        assert opened["error"] is None
        for i in range(12, 18):
            _, turn = await run_turn(svc, f"turn {i}", session_id=session_id)
            assert turn.terminal["status"] == "completed"
        items = conversation(await replay_all(svc, session_id))
    assert items.count(("terminal", "completed")) == 18


async def test_active_turn_limit_and_subagent_cancelled_with_parent(
    home: Path, project: Path
) -> None:
    """Sixteen running turns fill the service; a seventeenth is refused. A turn whose
    subagent is mid-stream ends cancelled with it."""
    with FakeProviderServer() as fake:
        write_settings(home, fake)
        task = FakeToolCall("t1", "task", json.dumps({"prompt": "dig"}))
        fake.enqueue(Reply(text=["delegating"], tool_calls=[task]))
        fake.enqueue(Reply(text=["child "], ending="stall"))
        for _ in range(15):
            fake.enqueue(Reply(text=["x"], ending="stall"))
        async with running_service(home, project) as service:
            starts = [await service.request("turn.start", {"prompt": f"p{i}"}) for i in range(16)]
            assert all(s["error"] is None for s in starts)
            refused = await service.request("turn.start", {"prompt": "one more"})
            assert refused["error"]["code"] == "too_many_active_turns"
            for start in starts:
                cancel = await service.request(
                    "turn.cancel", {"turn_id": start["payload"]["turn_id"]}
                )
                assert cancel["payload"]["status"] == "cancellation_requested"
            subagents = []
            for start in starts:
                events = await service.events_until_terminal(start["request_id"])
                assert events[-1]["payload"]["status"] == "cancelled"
                lifecycles = [
                    e["payload"]["activity"]
                    for e in events
                    if e["event"] == "turn.activity"
                    and e["payload"]["activity"]["kind"] == "lifecycle"
                ]
                subagents += [a for a in lifecycles if a.get("category") == "subagent_task"]
                task_ids = {
                    a["activity_id"] for a in lifecycles if a.get("category") == "subagent_task"
                }
                finishes = [a["status"] for a in lifecycles if a["activity_id"] in task_ids]
                if task_ids:
                    assert finishes == ["running", "cancelled"]
            assert len(subagents) == 1
