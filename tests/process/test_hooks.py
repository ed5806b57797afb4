"""Hooks through the real service process, against the loopback fake providers: a
blocking ``pre_tool_use`` hook (the tool never runs; the model sees the message), the
documented stdin of every event, confinement (project cwd, stripped environment, the
frontend's umask; in both modes), a timed-out hook killed with its process group,
project hooks only for trusted projects, and activity that carries status only."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from magi_code.storage.stamps import RACY_WINDOW_NS
from tests.process.daemon.support import paths
from tests.process.turn_support import (
    TurnEvents,
    body_text,
    check_turn,
    posted_bodies,
    run_turn,
    start_turn,
    stdout_text,
    strings_in,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import running_service

HOOK_SCRIPT = """\
import json, os, signal, subprocess, sys, time
mode, log = sys.argv[1], sys.argv[2]
event = json.loads(sys.stdin.read())
umask = os.umask(0)
record = {"mode": mode, "event": event, "cwd": os.getcwd(), "env": sorted(os.environ),
          "umask": umask}
with open(log, "a") as fh:
    fh.write(json.dumps(record) + "\\n")
if mode == "block":
    print("HOOK-BLOCK-MESSAGE: shell is not allowed here")
    print("this goes to stderr", file=sys.stderr)
    sys.exit(2)
if mode == "fail":
    sys.exit(1)
if mode == "create":
    # A file named by the call's pattern ("b*.py": b1.py), after the call beside it listed.
    pattern = event["tool_arguments"].get("pattern", "")
    if pattern.startswith("b"):
        time.sleep(0.5)
        open(pattern.replace("*", "1"), "w").close()
if mode == "deaf":
    # Ignores the SIGTERM that cancellation sends: only the SIGKILL after it ends this.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(log, "a") as fh:
        fh.write(json.dumps({"mode": "deaf", "pid": os.getpid()}) + "\\n")
    time.sleep(60)
if mode == "hang":
    child = subprocess.Popen(["sleep", sys.argv[3]])
    with open(log, "a") as fh:
        fh.write(json.dumps({"mode": "grandchild", "pid": child.pid}) + "\\n")
    time.sleep(60)
"""


def _lifecycles(turn: TurnEvents, category: str) -> list[tuple[str, str]]:
    """(category, status) of every lifecycle of the activities that started as ``category``."""
    ids = {
        a["activity_id"]
        for a in turn.of_kind("lifecycle")
        if a["category"] == category and a["status"] in ("running", "completed")
    }
    return [
        (a["category"], a["status"]) for a in turn.of_kind("lifecycle") if a["activity_id"] in ids
    ]


def _hook(mode: str, log: Path, script: Path, *args: str, **extra: Any) -> dict[str, Any]:
    return {"command": [sys.executable, str(script), mode, str(log), *args], **extra}


def _log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def hook_script(tmp_path: Path) -> Path:
    path = tmp_path / "hooks" / "record_hook.py"
    path.parent.mkdir()
    path.write_text(HOOK_SCRIPT)
    return path


# -- hooks ---------------------------------------------------------------------------------


async def test_a_blocking_pre_tool_hook_stops_the_call_and_tells_the_model(
    home: Path, project: Path, fake: FakeProviderServer, hook_script: Path, tmp_path: Path
) -> None:
    log = tmp_path / "hook-log.jsonl"
    hooks = {
        "pre_tool_use": [
            _hook("record", log, hook_script, matcher="read_*"),
            _hook("block", log, hook_script, matcher="shell"),
        ]
    }
    write_settings(home, fake, hooks=hooks)
    fake.enqueue(
        tool_reply(tool_call("s1", "shell", command="touch created-by-shell.txt")),
        Reply(text=["understood"]),
    )
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "make the file")
        stdout = stdout_text(turn.events)
    assert turn.terminal["status"] == "completed"
    assert not (project / "created-by-shell.txt").exists()
    # Only the matching hook ran, with the tool name and arguments on stdin.
    records = _log(log)
    assert [r["mode"] for r in records] == ["block"]
    event = records[0]["event"]
    assert event["event"] == "pre_tool_use"
    assert event["tool_name"] == "shell"
    assert event["tool_arguments"] == {"command": "touch created-by-shell.txt"}
    # The model saw the hook's stdout (not its stderr) as the tool's error result.
    result = body_text(posted_bodies(fake)[1])
    assert "Blocked by a pre_tool_use hook: HOOK-BLOCK-MESSAGE: shell is not allowed here" in result
    assert "this goes to stderr" not in result
    assert [a["status"] for a in turn.of_kind("tool")] == ["running", "failed"]
    assert _lifecycles(turn, "hook") == [("hook", "running"), ("activity", "completed")]
    for needle in ("HOOK-BLOCK-MESSAGE", "record_hook", str(log), "touch", "pre_tool_use"):
        assert needle not in stdout, needle


# Both modes: the environment and umask are the process's (embedded) or the shim's launch context.
@pytest.mark.both_modes
async def test_hooks_get_the_documented_events_and_run_confined(
    home: Path, project: Path, fake: FakeProviderServer, hook_script: Path, tmp_path: Path
) -> None:
    log = tmp_path / "hook-log.jsonl"
    hooks = {
        event: [_hook("record", log, hook_script, matcher="read_file")]
        for event in ("user_prompt_submit", "pre_tool_use", "post_tool_use", "stop")
    }
    hooks["post_tool_use"].append(_hook("fail", log, hook_script))
    write_settings(home, fake, hooks=hooks)
    (project / "notes.txt").write_text("NOTE-CONTENT\n")
    fake.enqueue(
        tool_reply(tool_call("r1", "read_file", path="notes.txt")), Reply(text=["All ", "done"])
    )
    old_umask = os.umask(0o027)
    try:
        async with running_service(home, project, {"MY_TOOL_VAR": "kept"}) as svc:
            accepted, turn = await run_turn(svc, "please read the notes")
    finally:
        os.umask(old_umask)
    assert turn.terminal["status"] == "completed"
    records = _log(log)
    events = [r["event"] for r in records]
    for event in events:
        event["project_dir"] = os.path.realpath(event["project_dir"])
    assert [(e["event"], r["mode"]) for e, r in zip(events, records, strict=True)] == [
        ("user_prompt_submit", "record"),
        ("pre_tool_use", "record"),
        ("post_tool_use", "record"),
        ("post_tool_use", "fail"),
        ("stop", "record"),
    ]
    common = {
        "session_id": accepted["session_id"],
        "turn_id": accepted["turn_id"],
        "project_dir": os.path.realpath(project),
    }
    arguments = {"path": "notes.txt"}
    assert events[0] == {"event": "user_prompt_submit", **common, "prompt": "please read the notes"}
    assert events[1] == {
        "event": "pre_tool_use",
        **common,
        "tool_name": "read_file",
        "tool_arguments": arguments,
    }
    assert events[2] == {
        "event": "post_tool_use",
        **common,
        "tool_name": "read_file",
        "tool_arguments": arguments,
        "tool_output": "NOTE-CONTENT\n",
        "tool_is_error": False,
    }
    assert events[4] == {"event": "stop", **common, "final_text": "All done"}
    for record in records:
        assert os.path.realpath(record["cwd"]) == os.path.realpath(project)
        assert record["umask"] == 0o027
        assert "MY_TOOL_VAR" in record["env"]
        for stripped in ("MC_HOME", "MC_SERVICE_MODE"):
            assert stripped not in record["env"]
    # One lifecycle per run, status only: a failing hook is `failed`, nothing more.
    hook_states = _lifecycles(turn, "hook")
    assert hook_states.count(("hook", "running")) == 5
    assert hook_states.count(("activity", "completed")) == 4
    assert hook_states.count(("activity", "failed")) == 1
    for activity in turn.of_kind("lifecycle"):
        assert set(activity) == {"activity_id", "kind", "category", "status", "details_omitted"}
    activity_text = json.dumps(turn.activities)
    for needle in ("record_hook", str(log), "NOTE-CONTENT", "notes.txt", "user_prompt_submit"):
        assert needle not in activity_text, needle


def _sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if marker in proc.cmdline():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


async def test_a_timed_out_hook_is_killed_with_its_process_group(
    home: Path,
    project: Path,
    fake: FakeProviderServer,
    hook_script: Path,
    tmp_path: Path,
    service_mode: str,
) -> None:
    log = tmp_path / "hook-log.jsonl"
    # A sleep length of this test's own (tests of both modes run at once).
    marker = f"29.{os.getpid() % 10000:04d}{len(service_mode)}"
    hooks = {"pre_tool_use": [_hook("hang", log, hook_script, marker, timeout_ms=1500)]}
    write_settings(home, fake, hooks=hooks)
    fake.enqueue(
        tool_reply(tool_call("s1", "shell", command="touch ran-anyway.txt")), Reply(text=["done"])
    )
    async with running_service(home, project) as svc:
        _, turn = await asyncio.wait_for(run_turn(svc, "go"), 60)
    assert turn.terminal["status"] == "completed"
    grandchild = [r["pid"] for r in _log(log) if r["mode"] == "grandchild"]
    assert len(grandchild) == 1, "the hook did not start its grandchild"
    assert _sleepers(marker) == []
    try:
        status = psutil.Process(grandchild[0]).status()
    except psutil.NoSuchProcess:
        status = None
    assert status in (None, psutil.STATUS_ZOMBIE), "the hook's grandchild outlived the hook"
    # A hook that did not answer does not block the call (only exit code 2 does).
    assert (project / "ran-anyway.txt").exists()
    assert _lifecycles(turn, "hook") == [("hook", "running"), ("activity", "failed")]


async def test_project_hooks_run_only_for_trusted_projects(
    home: Path, project: Path, fake: FakeProviderServer, hook_script: Path, tmp_path: Path
) -> None:
    log = tmp_path / "hook-log.jsonl"
    (project / ".magi-code").mkdir()
    (project / ".magi-code" / "settings.json").write_text(
        json.dumps({"hooks": {"user_prompt_submit": [_hook("record", log, hook_script)]}})
    )
    write_settings(home, fake)
    fake.set_default(Reply(text=["ok"]))
    async with running_service(home, project) as svc:
        _, untrusted = await run_turn(svc, "first")
        assert untrusted.terminal["status"] == "completed"
        assert _log(log) == []
        assert _lifecycles(untrusted, "hook") == []
        # Trust comes from the global file only, and is read with the settings per turn.
        write_settings(home, fake, trusted_projects=[str(tmp_path / "other"), str(project)])
        _, trusted = await run_turn(svc, "second")
    assert [r["event"]["prompt"] for r in _log(log)] == ["second"]
    assert _lifecycles(trusted, "hook") == [("hook", "running"), ("activity", "completed")]


async def test_cancelling_a_turn_during_a_hook_kills_its_process_group(
    home: Path,
    project: Path,
    fake: FakeProviderServer,
    hook_script: Path,
    tmp_path: Path,
    service_mode: str,
) -> None:
    log = tmp_path / "hook-log.jsonl"
    marker = f"28.{os.getpid() % 10000:04d}{len(service_mode)}"
    hooks = {"user_prompt_submit": [_hook("hang", log, hook_script, marker, timeout_ms=600_000)]}
    write_settings(home, fake, hooks=hooks)
    async with running_service(home, project) as svc:
        rid, accepted = await start_turn(svc, "go")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not (sleepers := _sleepers(marker)):
            assert loop.time() < deadline, "the hook's grandchild never started"
            await asyncio.sleep(0.05)
        cancel = await svc.request("turn.cancel", {"turn_id": accepted["turn_id"]})
        assert cancel["payload"]["status"] == "cancellation_requested"
        turn = check_turn(
            await svc.events_until_terminal(rid), accepted["turn_id"], accepted["session_id"]
        )
        assert turn.terminal["status"] == "cancelled"
        _, alive = await asyncio.to_thread(psutil.wait_procs, sleepers, 10)
        assert alive == []
        assert _sleepers(marker) == []
    assert _lifecycles(turn, "hook") == [("hook", "running"), ("activity", "cancelled")]
    # The hook ran before the first provider request: none was made.
    assert posted_bodies(fake) == []


async def test_a_cancelled_turn_ends_after_its_grace_when_its_hook_ignores_sigterm(
    home: Path,
    project: Path,
    fake: FakeProviderServer,
    hook_script: Path,
    tmp_path: Path,
    service_mode: str,
) -> None:
    """The hook's cleanup lasts until the SIGKILL that follows the ignored SIGTERM (1 s
    later here, 2 s by default); with the grace far below that, the terminal does not wait
    for it: the worker is abandoned (and logged), and its cleanup still kills the hook."""
    log = tmp_path / "hook-log.jsonl"
    hooks = {"user_prompt_submit": [_hook("deaf", log, hook_script, timeout_ms=600_000)]}
    write_settings(home, fake, hooks=hooks)
    grace = {"MC_CANCEL_GRACE_SECONDS": "0.2", "MC_DAEMON_TERM_GRACE_SECONDS": "1"}
    async with running_service(home, project, grace) as svc:
        rid, accepted = await start_turn(svc, "go")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not (deaf := [r["pid"] for r in _log(log) if "pid" in r]):
            assert loop.time() < deadline, "the hook never started"
            await asyncio.sleep(0.05)
        hook = psutil.Process(deaf[0])
        cancel = await svc.request("turn.cancel", {"turn_id": accepted["turn_id"]})
        assert cancel["payload"]["status"] == "cancellation_requested"
        turn = check_turn(
            await svc.events_until_terminal(rid), accepted["turn_id"], accepted["session_id"]
        )
        assert turn.terminal["status"] == "cancelled" and "failure" not in turn.terminal
        # The abandoned cleanup goes on: the hook is killed all the same.
        _, alive = await asyncio.to_thread(psutil.wait_procs, [hook], 20)
        assert alive == []
        # The session is free again for the next turn.
        fake.enqueue(Reply(text=["next"]))
        write_settings(home, fake)
        _, after = await run_turn(svc, "again", session_id=accepted["session_id"])
        assert after.terminal["status"] == "completed"
        await svc.close_stdin()
        await svc.wait()
        stderr = await svc.stderr_text()
    logged = stderr if service_mode == "embedded" else paths(home).log.read_text()
    (line,) = [line for line in logged.splitlines() if "did not stop within" in line]
    assert "0.2 s" in line and accepted["turn_id"] not in line and str(project) not in line
    assert len(posted_bodies(fake)) == 1  # only the second turn reached the provider


async def test_tool_hooks_apply_to_subagent_tool_calls(
    home: Path, project: Path, fake: FakeProviderServer, hook_script: Path, tmp_path: Path
) -> None:
    log = tmp_path / "hook-log.jsonl"
    hooks = {"pre_tool_use": [_hook("block", log, hook_script, matcher="shell")]}
    write_settings(home, fake, hooks=hooks)
    fake.enqueue(
        tool_reply(tool_call("p1", "task", description="make", prompt="make the file")),
        tool_reply(tool_call("k1", "shell", command="touch child-made.txt")),
        Reply(text=["child done"]),
        Reply(text=["parent done"]),
    )
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "delegate")
    assert turn.terminal["status"] == "completed"
    assert not (project / "child-made.txt").exists()
    assert [r["event"]["tool_name"] for r in _log(log)] == ["shell"]
    posts = posted_bodies(fake)
    assert len(posts) == 4
    assert "HOOK-BLOCK-MESSAGE" in body_text(posts[2])


async def test_a_read_sees_what_its_own_pre_tool_hook_changed(
    home: Path, project: Path, fake: FakeProviderServer, hook_script: Path, tmp_path: Path
) -> None:
    # Two listings of one reply run at the same time, and may share what one of them
    # checked; but the second's own hook adds a file after the first listed, and the
    # second must list it.
    log = tmp_path / "hook-log.jsonl"
    hooks = {"pre_tool_use": [_hook("create", log, hook_script, matcher="list_files")]}
    write_settings(home, fake, hooks=hooks)
    (project / "a.py").write_text("a\n")
    settled = time.monotonic() + RACY_WINDOW_NS / 1e9 + 0.2
    fake.enqueue(
        tool_reply(tool_call("l0", "list_files", pattern="*.py")),
        tool_reply(
            tool_call("l1", "list_files", pattern="*.py"),
            tool_call("l2", "list_files", pattern="b*.py"),
        ),
        Reply(text=["done"]),
    )
    async with running_service(home, project) as svc:
        await asyncio.sleep(settled - time.monotonic())
        _, turn = await run_turn(svc, "list")
    assert turn.terminal["status"] == "completed"
    results = [
        text
        for text in strings_in(posted_bodies(fake)[-1])
        if text.endswith(".py") or text == "No files match."
    ]
    assert results == ["a.py", "a.py", "b1.py"]
