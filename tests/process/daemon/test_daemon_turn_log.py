"""The daemon log: one line per turn end (hashed ID, provider, model, status, failure
label, HTTP status, retries, tokens), MC_LOG_LEVEL and MC_LOG_FORMAT=json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.process.daemon.support import paths
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, FakeUsage, HttpError, Reply
from tests.support.service import running_service


async def _turn(home: Path, project: Path, env: dict[str, str] | None = None) -> str:
    async with running_service(home, project, env) as svc:
        response = await svc.request("turn.start", {"prompt": "hi"})
        await svc.events_until_terminal(response["request_id"])
        return str(response["payload"]["turn_id"])


def _log_lines(home: Path) -> list[str]:
    return paths(home).log.read_text().splitlines()


async def test_each_turn_end_is_one_line_with_counts_and_labels(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(
        Reply(text=["ok"], usage=FakeUsage(input_tokens=11, output_tokens=7, cache_read_tokens=0))
    )
    done = await _turn(home, project)
    fake.set_default(HttpError(401, body={"error": {"message": "sk-secret-123"}}))
    failed = await _turn(home, project)
    lines = [line for line in _log_lines(home) if "turn end " in line]
    assert len(lines) == 2, lines
    ok, bad = lines
    assert f"turn={hashlib.sha256(done.encode()).hexdigest()[:12]}" in ok and done not in ok
    assert "provider=local model=m1 status=completed" in ok
    assert "input_tokens=11 output_tokens=7" in ok and "retries=0" in ok
    assert "status=failed failure=provider_auth_failed http_status=401" in bad
    assert failed not in bad
    assert "sk-secret" not in "\n".join(_log_lines(home))


async def test_mc_log_format_json_writes_one_object_per_line(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.set_default(Reply(text=["ok"]))
    await _turn(home, project, {"MC_LOG_FORMAT": "json"})
    records = [json.loads(line) for line in _log_lines(home)]
    (end,) = [r for r in records if r["message"].startswith("turn end ")]
    assert end["level"] == "info" and end["logger"] == "magi_code.core.turns"
    assert end["fields"]["status"] == "completed" and end["fields"]["provider"] == "local"
    assert {"ts", "pid"} <= end.keys()
