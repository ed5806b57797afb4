"""``magi-code --prompt``: one turn through the core, streamed to stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.service import ServiceProcess, service_env


def _settings(home: Path, base_url: str) -> None:
    provider = {"api": "openai-chat", "base_url": base_url + "/v1"}
    document = {"provider": "local", "model": "m1", "providers": {"local": provider}}
    (home / "settings.json").write_text(json.dumps(document))


def _prompt(home: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "magi_code", "--prompt", *args],
        cwd=project,
        env=service_env(home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_prompt_streams_the_answer_and_continues_a_session(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        _settings(home, fake.base_url)
        fake.enqueue(Reply(text=["Hello ", "there"]), Reply(text=["Again"]))
        first = _prompt(home, project, "hi")
        assert (first.returncode, first.stdout) == (0, "Hello there\n")
        service = await ServiceProcess.start(home, project)
        try:
            await service.initialize()
            listing = await service.request("session.list")
            (session,) = listing["payload"]["sessions"]
        finally:
            await service.stop()
        second = _prompt(home, project, "more", "--session", session["session_id"])
        assert (second.returncode, second.stdout) == (0, "Again\n")
        history = [
            m["content"] for m in fake.requests[-1].json["messages"] if m["role"] != "system"
        ]
        assert history == ["hi", "Hello there", "more"]


def test_prompt_failure_exits_non_zero_with_one_reason(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        _settings(home, fake.base_url)
        fake.enqueue(HttpError(401, {"error": {"message": "secret provider words"}}))
        result = _prompt(home, project, "hi")
    assert result.returncode != 0
    assert "failed" in result.stderr
    assert "secret provider words" not in result.stderr + result.stdout


def test_prompt_json_writes_only_the_turns_events_and_a_failure_on_its_terminal(
    home: Path, project: Path
) -> None:
    with FakeProviderServer() as fake:
        _settings(home, fake.base_url)
        fake.enqueue(HttpError(401, {"error": {"message": "secret provider words"}}))
        result = _prompt(home, project, "hi", "--json")
    assert result.returncode == 1
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    assert [m["kind"] for m in messages] == ["event"] * len(messages)
    assert messages[0]["event"] == "turn.started" and messages[-1]["event"] == "turn.terminal"
    terminal = messages[-1]["payload"]
    assert (terminal["status"], terminal["failure"]) == ("failed", "provider_auth_failed")
    session, failed = result.stderr.splitlines()
    assert session == f"magi-code: session {terminal['session_id']}"
    assert failed.endswith(f"failed: provider_auth_failed — {terminal['remedy']}")
    assert "secret provider words" not in result.stderr + result.stdout
