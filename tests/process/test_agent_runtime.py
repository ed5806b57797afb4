"""The agent runtime behind turns, through the real service process: a coding task with
built-in tools, an MCP server, subagents, reasoning summaries, activity overflow,
compaction, and a shell command cancelled mid-run. Every activity payload is checked for
its exact shape (``check_turn``) and for privacy (no argument, result, command, path or
server name)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from magi_code.storage.stamps import RACY_WINDOW_NS
from tests.process.turn_support import (
    APIS,
    TurnEvents,
    builtin_env,
    check_turn,
    conversation,
    read_until,
    replay_all,
    run_turn,
    start_turn,
    stdout_text,
    strings_in,
    tool_call,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.service import ServiceProcess, running_service

MCP_SERVER = Path(__file__).parents[1] / "unit" / "tools" / "mcp_echo_server.py"
BUILTIN_NAMES = {"read_file", "write_file", "edit_file", "list_files", "grep", "shell", "task"}


def _tools(text: str = "", *calls: FakeToolCall) -> Reply:
    return Reply(text=[text] if text else [], tool_calls=calls)


def _activity_text(turn: TurnEvents) -> str:
    return json.dumps(turn.activities)


def _tool_states(turn: TurnEvents) -> dict[str, list[str]]:
    states: dict[str, list[str]] = {}
    for activity in turn.of_kind("tool"):
        states.setdefault(activity["activity_id"], []).append(activity["status"])
    return states


# -- a real coding task ------------------------------------------------------------------


async def test_coding_task_reads_edits_and_runs_a_command_with_private_activity(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """One turn per provider API in one process (settings are re-read per turn)."""
    env: dict[str, str] = {}
    for api in APIS:
        env |= builtin_env(home, fake, api)
    async with running_service(home, project, env) as svc:
        for index, api in enumerate(APIS):
            builtin_env(home, fake, api)
            await _coding_turn(svc, project, fake, f"calc{index}")


async def _coding_turn(
    svc: ServiceProcess, project: Path, fake: FakeProviderServer, name: str
) -> None:
    script = f"{name}.py"
    (project / script).write_text("VALUE = 41\nprint('value', VALUE)\n")
    fake.enqueue(
        _tools("Let me look.", tool_call("c1", "read_file", path=script)),
        _tools("", tool_call("c2", "edit_file", path=script, old_string="41", new_string="42")),
        _tools("", tool_call("c3", "shell", command=f"python3 {script} > {name}-marker.txt")),
        Reply(text=["Done: ", "VALUE is 42."]),
    )
    first_post = len([r for r in fake.requests if r.method == "POST"])
    accepted, turn = await run_turn(svc, "Bump VALUE and run the script")
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "Let me look.Done: VALUE is 42."
    replay = conversation(await replay_all(svc, accepted["session_id"]))
    assert (project / script).read_text() == "VALUE = 42\nprint('value', VALUE)\n"
    assert (project / f"{name}-marker.txt").read_text() == "value 42\n"
    # Each call: running → completed, allowlisted plain name, local transport.
    tools = turn.of_kind("tool")
    names = ["read_file", "read_file", "edit_file", "edit_file", "shell", "shell"]
    assert [a["tool_name"] for a in tools] == names
    assert list(_tool_states(turn).values()) == [["running", "completed"]] * 3
    for activity in tools:
        assert activity["transport"] == "local"
        assert activity["server_id"] is None
    # Starts carry no timeout state; the shell result reports its own.
    assert [a["timed_out"] for a in tools if a["status"] == "running"] == [None] * 3
    assert tools[-1]["timed_out"] is False
    # Provider requests: the tool results went back to the model.
    posts = [r for r in fake.requests if r.method == "POST"][first_post:]
    assert len(posts) == 4
    assert any("VALUE = 41" in s for s in strings_in(posts[1].json))
    # Privacy: no argument, result, command or path text in any activity payload.
    text = _activity_text(turn)
    for needle in (name, "VALUE", "python3", "marker", str(project), "value", "print"):
        assert needle not in text, needle
    assert {a["kind"] for a in turn.activities} >= {"tool", "context", "usage"}
    # Tool calls and results are not replay items.
    assert replay == [
        ("message", "user", "Bump VALUE and run the script"),
        ("message", "assistant", "Let me look."),
        ("message", "assistant", "Done: VALUE is 42."),
        ("terminal", "completed"),
    ]


async def test_read_only_calls_of_one_reply_run_together_and_writes_alone(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    (project / "a.txt").write_text("alpha-content\n")
    fake.enqueue(
        _tools(
            "",
            tool_call("c1", "read_file", path="a.txt"),
            tool_call("c2", "list_files", pattern="*.txt"),
            tool_call("c3", "grep", pattern="alpha"),
            tool_call("c4", "write_file", path="b.txt", content="beta-content\n"),
            tool_call("c5", "read_file", path="b.txt"),
        ),
        Reply(text=["done"]),
    )
    async with running_service(home, project) as svc:
        accepted, turn = await run_turn(svc, "look around")
    assert turn.terminal["status"] == "completed"
    tools = [(a["tool_name"], a["status"]) for a in turn.of_kind("tool")]
    # The three reads all start before any of them ends; the write runs alone, and the
    # read after it is not run beside it (it sees the written file).
    assert tools[:3] == [("read_file", "running"), ("list_files", "running"), ("grep", "running")]
    assert sorted(tools[3:6]) == [
        ("grep", "completed"),
        ("list_files", "completed"),
        ("read_file", "completed"),
    ]
    assert tools[6:] == [
        ("write_file", "running"),
        ("write_file", "completed"),
        ("read_file", "running"),
        ("read_file", "completed"),
    ]
    # The model gets every result, in the order of its calls.
    strings = strings_in([r for r in fake.requests if r.method == "POST"][-1].json)
    expected = [
        "alpha-content\n",
        "a.txt",
        "a.txt:1:alpha-content",
        "Created b.txt (13 bytes).",
        "beta-content\n",
    ]
    results = [strings.index(text) for text in expected]
    assert results == sorted(results), strings
    # The session has each call before its result, the reads' calls before their results.
    history = (home / "sessions" / accepted["session_id"] / "history.jsonl").read_text()
    kinds = [
        (record["type"], record["call_id"])
        for record in map(json.loads, history.splitlines())
        if record["type"] in ("tool_call", "tool_result")
    ]
    assert kinds[:3] == [("tool_call", "c1"), ("tool_call", "c2"), ("tool_call", "c3")]
    assert sorted(kinds[3:6]) == [
        ("tool_result", "c1"),
        ("tool_result", "c2"),
        ("tool_result", "c3"),
    ]
    assert kinds[6:] == [
        ("tool_call", "c4"),
        ("tool_result", "c4"),
        ("tool_call", "c5"),
        ("tool_result", "c5"),
    ]


async def test_listings_in_a_turn_follow_changes_by_its_tools_and_other_processes(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    # Directories older than the racy window are read once a turn and reused while
    # unchanged: a file the turn wrote, or a shell removed, shows in the next listing.
    write_settings(home, fake)
    (project / "src").mkdir()
    (project / "src" / "a.py").write_text("a\n")
    settled = time.monotonic() + RACY_WINDOW_NS / 1e9 + 0.2

    def listing(call_id: str) -> FakeToolCall:
        return tool_call(call_id, "list_files", pattern="**/*.py")

    fake.enqueue(
        _tools("", listing("l1")),
        _tools(
            "",
            listing("l2"),
            tool_call("w", "write_file", path="src/b.py", content="b\n"),
            listing("l3"),
        ),
        _tools("", tool_call("s", "shell", command="rm src/a.py && mkdir src/c.py"), listing("l4")),
        Reply(text=["done"]),
    )
    async with running_service(home, project) as svc:
        await asyncio.sleep(settled - time.monotonic())
        _, turn = await run_turn(svc, "list the files")
    assert turn.terminal["status"] == "completed"
    strings = strings_in([r for r in fake.requests if r.method == "POST"][-1].json)
    listings = [text for text in strings if text.startswith("src/")]
    assert listings == [
        "src/a.py",
        "src/a.py",
        "src/a.py\nsrc/b.py",
        "src/b.py\nsrc/c.py/",
    ]


async def test_context_and_usage_activity_reflect_the_provider_usage(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, "openai-responses", context_window=50_000)
    fake.enqueue(Reply(text=["ok"]))
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "hi")
    usage = turn.of_kind("usage")
    assert len(usage) == 1
    assert usage[0]["source"] == "provider_request"
    assert usage[0]["final_usage"] is True
    assert usage[0]["output"] == 7
    assert usage[0]["request_sequence"] == 1
    contexts = turn.of_kind("context")
    assert contexts[0]["source"] == "fallback_estimate"
    assert all(c["max_tokens"] == 50_000 for c in contexts)
    assert contexts[-1]["source"] == "provider_exact"


# -- MCP -----------------------------------------------------------------------------------


async def test_mcp_tool_call_is_projected_by_hash_only(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    server_name = "privsrvname"
    servers = {server_name: {"command": sys.executable, "args": [str(MCP_SERVER)]}}
    write_settings(home, fake, mcp_servers=servers)
    fake.enqueue(
        _tools("", tool_call("m1", f"mcp__{server_name}__echo", text="mcp-echo-payload")),
        Reply(text=["echoed"]),
    )
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "echo something")
        events = await svc.events_until_terminal(rid)
        turn = check_turn(events, accepted["turn_id"], accepted["session_id"])
        stdout = stdout_text(events)
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "echoed"
    tools = turn.of_kind("tool")
    assert [a["status"] for a in tools] == ["running", "completed"]
    digest = hashlib.sha256(server_name.encode()).hexdigest()
    for activity in tools:
        assert activity["transport"] == "mcp"
        assert activity["tool_name"] is None
        assert activity["server_id"] is not None
        assert activity["server_id"].endswith(digest)
    assert tools[0]["timed_out"] is None
    assert tools[1]["timed_out"] in (False, None)
    # The MCP result went back to the model.
    posts = [r for r in fake.requests if r.method == "POST"]
    assert any("mcp-echo-payload" in s for s in strings_in(posts[1].json))
    assert any(f"mcp__{server_name}__echo" in s for s in strings_in(posts[0].json))
    for needle in (server_name, "mcp-echo-payload", "echo_server", "mcp__"):
        assert needle not in stdout, needle


@pytest.mark.parametrize("trusted", [False, True])
async def test_a_project_files_mcp_servers_start_only_in_a_trusted_project(
    home: Path, project: Path, fake: FakeProviderServer, trusted: bool
) -> None:
    # A cloned repository's settings must not be enough to run the commands they name.
    write_settings(home, fake, trusted_projects=[str(project)] if trusted else [])
    servers = {"projsrv": {"command": sys.executable, "args": [str(MCP_SERVER)]}}
    (project / ".magi-code").mkdir()
    (project / ".magi-code" / "settings.json").write_text(json.dumps({"mcp_servers": servers}))
    fake.enqueue(Reply(text=["done"]))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "which tools?")
        events = await svc.events_until_terminal(rid)
        turn = check_turn(events, accepted["turn_id"], accepted["session_id"])
    assert turn.terminal["status"] == "completed"
    offered = strings_in(fake.requests[0].json)
    assert ("mcp__projsrv__echo" in offered) is trusted
    assert any("list_files" in name for name in offered)  # the built-in tools either way


async def test_published_mcp_server_package_answers_a_tool_call(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    """The ``mcp-server-time`` package from PyPI (a dev dependency), started per turn."""
    servers = {"clock": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}}
    write_settings(home, fake, mcp_servers=servers)
    fake.enqueue(
        _tools("", tool_call("t1", "mcp__clock__get_current_time", timezone="UTC")),
        Reply(text=["it is now"]),
    )
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "what time is it?")
        events = await svc.events_until_terminal(rid)
        turn = check_turn(events, accepted["turn_id"], accepted["session_id"])
    assert turn.terminal["status"] == "completed"
    assert [(a["status"], a["transport"]) for a in turn.of_kind("tool")] == [
        ("running", "mcp"),
        ("completed", "mcp"),
    ]
    posts = [r for r in fake.requests if r.method == "POST"]
    offered = " ".join(strings_in(posts[0].json))
    assert "mcp__clock__get_current_time" in offered
    result = " ".join(strings_in(posts[1].json))
    assert "UTC" in result and "datetime" in result


# -- subagents -----------------------------------------------------------------------------


async def test_task_tool_runs_a_subagent_linked_by_parent_activity(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    (project / "notes.txt").write_text("child-visible-content\n")
    fake.enqueue(
        _tools("", tool_call("p1", "task", description="inspect", prompt="Read notes.txt")),
        _tools("child says hi", tool_call("k1", "read_file", path="notes.txt")),
        Reply(text=["child-final-answer"]),
        Reply(text=["Parent ", "done"]),
    )
    async with running_service(home, project) as svc:
        accepted, turn = await run_turn(svc, "delegate please")
        replay = conversation(await replay_all(svc, accepted["session_id"]))
    assert turn.terminal["status"] == "completed"
    # Child text is not streamed; only the parent's text is the turn's text.
    assert turn.terminal["assistant_text"] == "Parent done"
    task_starts = [
        a
        for a in turn.of_kind("lifecycle")
        if a["category"] == "subagent_task" and a["status"] == "running"
    ]
    assert len(task_starts) == 1
    task_id = task_starts[0]["activity_id"]
    children = [a for a in turn.activities if a.get("parent_activity_id") == task_id]
    assert children, turn.activities
    assert all(a["kind"] == "lifecycle" for a in children)
    assert [a["status"] for a in children] == ["running"]
    finishes = [a for a in turn.of_kind("lifecycle") if a["activity_id"] == task_id]
    assert finishes[-1]["category"] == "activity"
    assert finishes[-1]["status"] == "completed"
    aggregate = [a for a in turn.of_kind("usage") if a["source"] == "subagent_aggregate"]
    assert len(aggregate) == 1
    assert aggregate[0]["output"] == 14  # two child requests of 7 output tokens each
    # Only the main agent's last request is final; the child's requests are only here.
    assert aggregate[0]["final_usage"] is False
    requests = [a for a in turn.of_kind("usage") if a["source"] == "provider_request"]
    assert [a["final_usage"] for a in requests] == [False, True]
    # The subagent task hangs off the parent's `task` tool call.
    call_ids = {a["activity_id"] for a in turn.of_kind("tool")}
    assert task_starts[0]["parent_activity_id"] in call_ids
    # The parent's own `task` call is a tool activity with the allowlisted name.
    assert {a["tool_name"] for a in turn.of_kind("tool")} == {"task"}
    # The parent model got the child's final answer as the tool result.
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 4
    assert any("child-final-answer" in s for s in strings_in(posts[3].json))
    assert "child-visible-content" not in _activity_text(turn)
    assert replay == [
        ("message", "user", "delegate please"),
        ("message", "assistant", "Parent done"),
        ("terminal", "completed"),
    ]


# -- reasoning -----------------------------------------------------------------------------


async def test_responses_reasoning_summary_is_projected(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    env = builtin_env(home, fake, "openai-responses")
    fake.enqueue(Reply(text=["answer"], reasoning_summary="Considering the options"))
    async with running_service(home, project, env) as svc:
        _, turn = await run_turn(svc, "think")
    summaries = turn.of_kind("reasoning_summary")
    assert len(summaries) == 1
    assert summaries[0]["text"] == "Considering the options"
    assert summaries[0]["redacted"] is False
    assert summaries[0]["truncated"] is False
    assert turn.terminal["assistant_text"] == "answer"


@pytest.mark.parametrize("api", ["anthropic", "openai-chat"])
async def test_raw_thinking_is_never_projected(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    write_settings(home, fake, api)
    fake.enqueue(Reply(text=["answer"], reasoning_summary="raw-thinking-text-private"))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "think")
        events = await svc.events_until_terminal(rid)
    turn = check_turn(events, accepted["turn_id"], accepted["session_id"])
    assert turn.of_kind("reasoning_summary") == []
    assert "raw-thinking-text-private" not in stdout_text(events)
    assert turn.terminal["assistant_text"] == "answer"


# -- activity overflow ---------------------------------------------------------------------


def _wait_for_posts_blocking(fake: FakeProviderServer, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len([r for r in fake.requests if r.method == "POST"]) < count:
        assert time.monotonic() < deadline, "the tool loop did not finish"
        time.sleep(0.05)


async def test_activity_flood_drops_activity_but_never_text(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    calls = [tool_call(f"f{i}", "list_files", pattern="*.none") for i in range(400)]
    tail = [f"after-{i} " for i in range(50)]
    fake.enqueue(Reply(text=["before ", "tools "], tool_calls=calls), Reply(text=tail))
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "flood")
        # A client that stops reading: block this test's event loop (so nothing drains
        # the stdout pipe) until the runtime has sent the tool results back.
        _wait_for_posts_blocking(fake, 2, 60.0)
        turn = check_turn(
            await svc.events_until_terminal(rid), accepted["turn_id"], accepted["session_id"]
        )
    assert turn.terminal["status"] == "completed"
    assert turn.terminal["assistant_text"] == "before tools " + "".join(tail)
    assert turn.terminal["activity_dropped"] > 0
    assert turn.missing_sequences == turn.terminal["activity_dropped"]


# -- compaction ----------------------------------------------------------------------------


async def test_small_context_window_compacts_then_replays_and_continues(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, context_window=300)
    long_prompt = "Remember this long requirement. " * 40  # ~1,300 bytes > 80% of 300 tokens
    fake.enqueue(
        Reply(text=["First answer"]),
        Reply(text=["SUMMARY-OF-EARLIER-WORK"]),
        Reply(text=["Second answer"]),
        Reply(text=["Third answer"]),
    )
    async with running_service(home, project) as svc:
        accepted, first = await run_turn(svc, long_prompt)
        session_id = accepted["session_id"]
        assert first.of_kind("compaction") == []
        _, second = await run_turn(svc, "continue", session_id=session_id)
        assert second.terminal["status"] == "completed"
        assert second.terminal["assistant_text"] == "Second answer"
        compaction = second.of_kind("compaction")
        assert [a["status"] for a in compaction] == ["triggered", "running", "completed"]
        assert len({a["activity_id"] for a in compaction}) == 1
        assert compaction[-1]["replay_required"] is True
        assert compaction[0]["max_tokens"] == 300
        replay = conversation(await replay_all(svc, session_id))
        assert replay == [
            ("summary", "SUMMARY-OF-EARLIER-WORK"),
            ("message", "user", "continue"),
            ("message", "assistant", "Second answer"),
            ("terminal", "completed"),
        ]
        _, third = await run_turn(svc, "and more", session_id=session_id)
        assert third.terminal["assistant_text"] == "Third answer"
        assert third.of_kind("compaction") == []
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 4
    # The summary request carried the old conversation; the next requests carry the
    # summary instead of it.
    assert any("Remember this long requirement" in s for s in strings_in(posts[1].json))
    for post in posts[2:]:
        strings = strings_in(post.json)
        assert any("SUMMARY-OF-EARLIER-WORK" in s for s in strings)
        assert not any("Remember this long requirement" in s for s in strings)
        assert not any("First answer" in s for s in strings)
    assert any("Second answer" in s for s in strings_in(posts[3].json))


# -- shell cancellation --------------------------------------------------------------------


SLEEP_MARKER = "sleep 29.4321"


def _sleepers() -> list[psutil.Process]:
    """The scripted command's processes, wherever they run (embedded or daemon mode)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if SLEEP_MARKER.split()[1] in " ".join(proc.cmdline()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


async def test_cancel_during_a_shell_command_leaves_no_process_behind(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(_tools("", tool_call("s1", "shell", command=f"{SLEEP_MARKER}; echo never")))
    svc = await ServiceProcess.start(home, project)
    try:
        await svc.initialize()
        rid, accepted = await start_turn(svc, "run it")
        await read_until(
            svc,
            lambda m: (
                m.get("event") == "turn.activity" and m["payload"]["activity"]["kind"] == "tool"
            ),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not (sleepers := _sleepers()):
            assert loop.time() < deadline, "the shell command never started"
            await asyncio.sleep(0.05)
        cancel = await svc.request("turn.cancel", {"turn_id": accepted["turn_id"]})
        assert cancel["payload"]["status"] == "cancellation_requested"
        turn = check_turn(
            await svc.events_until_terminal(rid), accepted["turn_id"], accepted["session_id"]
        )
        assert turn.terminal["status"] == "cancelled"
        _, alive = await asyncio.to_thread(psutil.wait_procs, sleepers, 10)
        assert alive == []
        assert _sleepers() == []
        # The interrupted tool call does not break the session: the next turn works.
        fake.enqueue(Reply(text=["fine"]))
        _, after = await run_turn(svc, "next", session_id=accepted["session_id"])
        assert after.terminal["assistant_text"] == "fine"
    finally:
        await svc.stop()


# Both modes: the children's environment comes from the process (embedded) or the shim's
# launch context.
@pytest.mark.both_modes
async def test_tool_and_mcp_children_do_not_inherit_credentials_or_service_variables(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    env = builtin_env(home, fake, "anthropic")
    env["MY_PROVIDER_KEY"] = "custom-key-value-0001"
    settings = json.loads((home / "settings.json").read_text())
    settings["providers"] = {
        "other": {
            "api": "openai-chat",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": "MY_PROVIDER_KEY",
        }
    }
    settings["mcp_servers"] = {"envsrv": {"command": sys.executable, "args": [str(MCP_SERVER)]}}
    (home / "settings.json").write_text(json.dumps(settings))
    fake.enqueue(
        _tools(
            "",
            tool_call("e1", "shell", command="env > env-dump.txt"),
            tool_call("e2", "mcp__envsrv__echo", text="probe", env_name="ANTHROPIC_API_KEY"),
            tool_call("e3", "mcp__envsrv__echo", text="probe", env_name="MC_HOME"),
        ),
        Reply(text=["checked"]),
    )
    async with running_service(home, project, env) as svc:
        _, turn = await run_turn(svc, "inspect the environment")
    assert turn.terminal["status"] == "completed"
    dump = (project / "env-dump.txt").read_text()
    names = {line.split("=", 1)[0] for line in dump.splitlines() if "=" in line}
    for name in ("ANTHROPIC_API_KEY", "MY_PROVIDER_KEY", "MC_HOME", "MC_SERVICE_MODE"):
        assert name not in names, name
    assert "sk-ant-test-key-0000" not in dump
    assert "custom-key-value-0001" not in dump
    results = strings_in(fake.requests[-1].json)
    assert any("probe|ANTHROPIC_API_KEY=<unset>" in s for s in results)
    assert any("probe|MC_HOME=<unset>" in s for s in results)
    # The per-turn MCP server process is gone once the turn has ended.
    deadline = time.monotonic() + 15
    while _mcp_servers_running(project):
        assert time.monotonic() < deadline, "an MCP server outlived its turn"
        await asyncio.sleep(0.1)


def _mcp_servers_running(project: Path) -> list[int]:
    """This test's MCP servers (they run in its project directory)."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if str(MCP_SERVER) in proc.cmdline() and Path(proc.cwd()) == project.resolve():
                pids.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return pids
