"""Why a turn failed is on its ``turn.terminal`` (both modes), and on the frontend's stderr.

A failed terminal carries ``failure`` (the fixed label) and ``remedy`` (one line); the
service prints ``magi-code: turn <id> failed: <label> — <remedy>`` on its stderr
(embedded), or the shim does for the turns of its connection (daemon mode), with the same
remedy. Neither has anything of the provider's text, URLs, paths or secrets. Each case
here is one way a turn fails for real: no credentials, a refused key, a provider that
keeps failing with 5xx, one that cannot be reached, a broken or incomplete settings file.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from magi_code.providers.stream import RetryPolicy
from magi_code.turns.failures import REMEDIES
from tests.process.turn_support import (
    base_url_for,
    posted_bodies,
    read_until,
    run_turn,
    start_turn,
    write_settings,
)
from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.service import running_service

# Both modes: the embedded adapter prints the reason, in daemon mode the shim does.
pytestmark = pytest.mark.both_modes

SECRET_BODY = "sk-leaked-0000 https://internal.example/path"
KEY_VARIABLE = "LOCAL_PROVIDER_KEY"
KEY_VALUE = "sk-local-0123456789-value"


def _custom_provider(home: Path, base_url: str, **provider: Any) -> None:
    document = {
        "provider": "local",
        "model": "m1",
        "providers": {"local": {"api": "openai-chat", "base_url": base_url, **provider}},
    }
    (home / "settings.json").write_text(json.dumps(document))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _failed_turn(
    home: Path, project: Path, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    """The failed terminal's payload, and the one stderr line that reports it."""
    async with running_service(home, project, env) as svc:
        response = await svc.request("turn.start", {"prompt": "hi"})
        assert response["error"] is None, response
        turn_id = response["payload"]["turn_id"]
        events = await svc.events_until_terminal(response["request_id"])
        await svc.close_stdin()
        assert await svc.wait() == 0
        stderr = await svc.stderr_text()
    terminal: dict[str, Any] = events[-1]["payload"]
    assert terminal["status"] == "failed", terminal
    lines = [line for line in stderr.splitlines() if f"turn {turn_id} failed:" in line]
    assert len(lines) == 1, stderr
    return terminal, lines[0]


def _check(terminal: dict[str, Any], line: str, label: str, *forbidden: str) -> str:
    """The terminal says ``label`` and a one-line remedy, the stderr line says the same,
    and neither holds any of ``forbidden``; returns the remedy."""
    assert terminal["failure"] == label, terminal
    remedy: str = terminal["remedy"]
    assert remedy and "\n" not in remedy
    assert line == f"magi-code: turn {terminal['turn_id']} failed: {label} — {remedy}"
    assert "config.set" not in remedy  # remedies name commands, not protocol operations
    for needle in (SECRET_BODY, "sk-leaked", "internal.example", "127.0.0.1", *forbidden):
        assert needle not in json.dumps(terminal) and needle not in line, needle
    return remedy


async def test_a_turn_without_credentials_says_auth_missing_and_how_to_log_in(
    home: Path, project: Path
) -> None:
    (home / "settings.json").write_text(json.dumps({"provider": "anthropic", "model": "m"}))
    terminal, line = await _failed_turn(home, project)
    remedy = _check(terminal, line, "auth_missing", str(home))
    assert "ANTHROPIC_API_KEY" in remedy and "magi-code login --provider anthropic" in remedy


async def test_a_custom_provider_without_its_key_names_its_key_variable(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    _custom_provider(home, base_url_for(fake, "openai-chat"), api_key_env=KEY_VARIABLE)
    terminal, line = await _failed_turn(home, project)
    remedy = _check(terminal, line, "auth_missing", str(home))
    assert KEY_VARIABLE in remedy and "login" not in remedy
    assert posted_bodies(fake) == []


async def test_a_401_from_a_custom_provider_names_its_key_variable_not_login(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    _custom_provider(home, base_url_for(fake, "openai-chat"), api_key_env=KEY_VARIABLE)
    fake.set_default(HttpError(401, body={"error": {"message": SECRET_BODY}}))
    terminal, line = await _failed_turn(home, project, {KEY_VARIABLE: KEY_VALUE})
    remedy = _check(terminal, line, "provider_auth_failed", KEY_VALUE, str(home))
    assert remedy == f"the provider refused the credentials: check the key in {KEY_VARIABLE}"
    assert "login" not in remedy
    # The key did reach the provider: it was refused, not missing.
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY_VALUE}"


async def test_a_provider_failing_with_5xx_after_its_retries_is_a_server_error(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.set_default(HttpError(503, body={"error": {"message": SECRET_BODY}}, retry_after="0"))
    terminal, line = await _failed_turn(home, project)
    remedy = _check(terminal, line, "provider_server_error")
    assert "could not be reached" not in remedy
    # It was reached, and asked again as often as the retry policy allows.
    assert len(posted_bodies(fake)) == 1 + RetryPolicy().max_retries


async def test_a_provider_that_cannot_be_reached_is_unavailable(home: Path, project: Path) -> None:
    _custom_provider(home, f"http://127.0.0.1:{_closed_port()}/v1")
    # Each connection is refused at once; only the retries' backoff (0.5 s, doubling) is
    # shortened, not how often the turn tries.
    terminal, line = await _failed_turn(home, project, {"MC_RETRY_BASE_SECONDS": "0.01"})
    _check(terminal, line, "provider_unavailable")


async def test_a_broken_settings_file_says_configuration_unavailable(
    home: Path, project: Path
) -> None:
    (home / "settings.json").write_text('{"provider": "anthropic",\n  "model": }')
    terminal, line = await _failed_turn(home, project)
    remedy = _check(terminal, line, "configuration_unavailable", str(home), "settings.json")
    assert "magi-code doctor" in remedy


async def test_an_undefined_provider_says_so_and_names_a_command_not_an_operation(
    home: Path, project: Path
) -> None:
    (home / "settings.json").write_text(json.dumps({"provider": "nowhere", "model": "m"}))
    terminal, line = await _failed_turn(home, project)
    remedy = _check(terminal, line, "provider_not_configured")
    assert remedy == REMEDIES["provider_not_configured"] and "magi-code doctor" in remedy


async def test_completed_and_cancelled_terminals_carry_no_failure(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["fine"]), Reply(text=["never ", "ends"], ending="stall"))
    async with running_service(home, project) as svc:
        _, completed = await run_turn(svc, "hi")
        rid, accepted = await start_turn(svc, "again", session_id=completed.terminal["session_id"])
        await read_until(svc, lambda m: m.get("event") == "turn.assistant_delta")
        await svc.request("turn.cancel", {"turn_id": accepted["turn_id"]})
        cancelled = (await svc.events_until_terminal(rid))[-1]["payload"]
    assert (completed.terminal["status"], cancelled["status"]) == ("completed", "cancelled")
    for terminal in (completed.terminal, cancelled):
        assert "failure" not in terminal and "remedy" not in terminal
