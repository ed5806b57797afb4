"""A turn's provider credentials come from its client's launch context, never from the
environment of the process running it (in the daemon: the daemon's own)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from magi_code.auth.credentials import CredentialsError
from magi_code.sessions.store import SessionContext
from magi_code.storage.launch import LaunchContext
from magi_code.turns.runtime import TurnRequest, TurnRuntime, read_settings
from tests.support.fake_providers import FakeProviderServer, Reply

KEY_ENV = "MY_PROVIDER_API_KEY"


class Sink:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def text(self, delta: str) -> None:
        self.deltas.append(delta)

    def activity(self, payload: dict[str, Any]) -> None:
        pass

    async def record(self, record: Mapping[str, Any]) -> int:
        return 1


def _request(tmp_path: Path, fake: FakeProviderServer, env: dict[str, str]) -> TurnRequest:
    home = tmp_path / "mc-home"
    home.mkdir(exist_ok=True)
    provider = {"api": "openai-chat", "base_url": f"{fake.base_url}/v1", "api_key_env": KEY_ENV}
    doc = {"provider": "keyed", "model": "m1", "providers": {"keyed": provider}}
    (home / "settings.json").write_text(json.dumps(doc))
    ctx = LaunchContext(home, tmp_path, env)
    history = SessionContext(None, None, (), history_cut=False, gap=False)
    return TurnRequest(ctx, "ses_x", "turn_x", "hi", history)


async def _run(turn: TurnRequest) -> Sink:
    runtime = TurnRuntime()
    sink = Sink()
    try:
        await runtime.run(turn, read_settings(turn.ctx), sink, lambda settle: None)
    finally:
        await runtime.client.aclose()
    return sink


async def test_the_key_is_read_from_the_launch_context(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-process-own-0000")
    fake.enqueue(Reply(text=["ok"]))
    sink = await _run(_request(tmp_path, fake, {KEY_ENV: "sk-launch-0000"}))
    assert sink.deltas == ["ok"]
    assert fake.requests[0].headers["authorization"] == "Bearer sk-launch-0000"


async def test_a_key_only_the_process_has_is_never_used(
    tmp_path: Path, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-process-own-0000")
    with pytest.raises(CredentialsError) as failure:
        await _run(_request(tmp_path, fake, {}))
    assert failure.value.label == "auth_missing"
    assert fake.requests == []
