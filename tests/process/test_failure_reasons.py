"""Why a turn failed reaches the frontend's stderr (both modes) and v2 answers.

The v1 terminal says only ``failed``; the service prints
``magi-code: turn <id> failed: <label> — <remedy>`` on its stderr (embedded), or the shim
does for the turns of its connection (daemon mode), with nothing of the provider's
text, URLs, paths or secrets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.turns.failures import REMEDIES
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, HttpError
from tests.support.service import running_service

SECRET_BODY = "sk-leaked-0000 https://internal.example/path"


@pytest.fixture
def fake() -> Iterator[FakeProviderServer]:
    with FakeProviderServer() as server:
        yield server


async def _failed_turn(home: Path, project: Path, env: dict[str, str] | None = None) -> str:
    async with running_service(home, project, env) as svc:
        response = await svc.request("turn.start", {"prompt": "hi"})
        assert response["error"] is None, response
        turn_id = response["payload"]["turn_id"]
        events = await svc.events_until_terminal(response["request_id"])
        assert events[-1]["payload"]["status"] == "failed"
        assert "failure" not in events[-1]["payload"]  # the v1 shape carries no reason
        await svc.close_stdin()
        assert await svc.wait() == 0
        stderr = await svc.stderr_text()
    lines = [line for line in stderr.splitlines() if f"turn {turn_id} failed:" in line]
    assert len(lines) == 1, stderr
    return lines[0]


async def test_a_turn_without_credentials_prints_auth_missing_and_its_remedy(
    home: Path, project: Path
) -> None:
    (home / "settings.json").write_text(json.dumps({"provider": "anthropic", "model": "m"}))
    line = await _failed_turn(home, project)
    assert line.startswith("magi-code: turn ") and ": auth_missing — " in line
    assert line.endswith(REMEDIES["auth_missing"]) and "magi-code login" in line


async def test_a_provider_error_prints_its_label_and_nothing_of_the_provider(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.set_default(HttpError(403, body={"error": {"message": SECRET_BODY}}))
    line = await _failed_turn(home, project)
    label = line.split(" failed: ")[1].split(" — ")[0]
    assert label in REMEDIES and label.startswith("provider_")
    assert "sk-leaked" not in line and "internal.example" not in line and str(home) not in line
