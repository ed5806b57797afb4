"""Catalogs and configuration through the real service: discovery, scoped writes, the
single configuration worker, and turns picking up a new selection."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.support.fake_providers import FakeModel, FakeProviderServer, Reply
from tests.support.service import running_service
from tests.support.settings_lock import settings_lock_held


def _write_settings(home: Path, base_url: str, **extra: object) -> None:
    provider = {"api": "openai-chat", "base_url": base_url + "/v1", "label": "Local"}
    document = {"providers": {"local": provider}, "unknown_key": {"kept": [1, 2]}, **extra}
    (home / "settings.json").write_text(json.dumps(document))


async def test_refresh_select_and_next_turn_uses_the_selection(home: Path, project: Path) -> None:
    with FakeProviderServer() as fake:
        fake.models = [
            FakeModel("m-small", "Small", 32_000, 4096, ()),
            FakeModel("m-large", "Large", 128_000, 8192, ()),
        ]
        _write_settings(home, fake.base_url)
        async with running_service(home, project) as service:
            providers = await service.request("catalog.providers")
            ids = [e["provider_id"] for e in providers["payload"]["entries"]]
            assert ids == ["anthropic", "local", "openai-codex"]
            before = await service.request("catalog.models", {"provider_id": "local"})
            assert before["payload"]["state"] == "unavailable"
            refused = await service.request(
                "config.set",
                {"scope": "project", "selection": {"provider_id": "local", "model_id": "m-large"}},
            )
            assert refused["error"]["code"] == "catalog_unavailable"
            refreshed = await service.request("catalog.refresh", {"provider_id": "local"})
            assert refreshed["payload"] == {"provider_id": "local", "state": "fresh_cache"}
            models = await service.request("catalog.models", {"provider_id": "local", "limit": 1})
            assert models["payload"]["state"] == "fresh_cache"
            assert models["payload"]["next_offset"] == 1
            (entry,) = models["payload"]["entries"]
            assert set(entry) == {
                "provider_id",
                "model_id",
                "label",
                "available",
                "context_window",
                "max_output_tokens",
                "available_thinking_levels",
            }
            assert entry["model_id"] == "m-small" and entry["available"] is True
            chosen = await service.request(
                "config.set",
                {"scope": "project", "selection": {"provider_id": "local", "model_id": "m-large"}},
            )
            assert chosen["payload"]["persisted"] is True
            assert chosen["payload"]["effective"]["selection"] == {
                "provider_id": "local",
                "model_id": "m-large",
            }
            fake.enqueue(Reply(text=["ok"]))
            turn = await service.request("turn.start", {"prompt": "which model?"})
            events = await service.events_until_terminal(turn["request_id"])
            assert events[-1]["payload"]["status"] == "completed"
            assert fake.requests[-1].json["model"] == "m-large"
    project_settings = json.loads((project / ".magi-code" / "settings.json").read_text())
    assert project_settings["model"] == "m-large"
    global_settings = json.loads((home / "settings.json").read_text())
    assert global_settings["unknown_key"] == {"kept": [1, 2]}
    assert (home / "settings.schema.json").is_file()


# Both modes: the environment is the process's (embedded) or the shim's launch context.
@pytest.mark.both_modes
async def test_environment_override_masks_a_global_write(home: Path, project: Path) -> None:
    async with running_service(home, project, {"MC_MODEL": "env-model"}) as service:
        written = await service.request("config.set", {"scope": "global", "fast": True})
        effective = written["payload"]["effective"]
        assert effective["fast"] is True
        assert effective["selection"]["model_id"] == "env-model"


async def test_configuration_busy_while_a_slow_refresh_runs_and_a_turn_streams(
    home: Path, project: Path
) -> None:
    with FakeProviderServer() as fake:
        _write_settings(home, fake.base_url, provider="local", model="m1")
        fake.listing_delay = 2.0
        fake.enqueue(Reply(text=[f"d{i} " for i in range(20)], chunk_delay=0.05))
        async with running_service(home, project) as service:
            turn = await service.request("turn.start", {"prompt": "stream"})
            await service.send(
                {
                    "protocol_version": 1,
                    "kind": "request",
                    "request_id": "refresh-1",
                    "method": "catalog.refresh",
                    "payload": {"provider_id": "local"},
                }
            )
            busy = await service.request("config.get")
            assert busy["error"]["code"] == "configuration_busy"
            events = await service.events_until_terminal(turn["request_id"])
            assert events[-1]["payload"]["status"] == "completed"
            refreshed = await service.response_for("refresh-1")
            assert refreshed["payload"]["state"] == "fresh_cache"
            await asyncio.sleep(0)
            assert (await service.request("config.get"))["error"] is None


# Both modes: the v1 admission path is the stdio adapter's (embedded) or the daemon's.
@pytest.mark.both_modes
async def test_a_v1_turn_starts_while_a_settings_write_is_in_progress(
    home: Path, project: Path
) -> None:
    # The spec: a v1 turn's worker reloads the settings before provider execution, so a
    # config.set still running (here: waiting for another process's lock) never makes
    # turn.start fail at acceptance.
    with FakeProviderServer() as fake:
        _write_settings(home, fake.base_url, provider="local", model="m1")
        fake.enqueue(Reply(text=["ran"]))
        async with running_service(home, project) as service:
            with settings_lock_held(home / "settings.json") as lock:
                write_id = service.next_id("set")
                await service.send(
                    {
                        "protocol_version": 1,
                        "kind": "request",
                        "request_id": write_id,
                        "method": "config.set",
                        "payload": {"scope": "global", "fast": True},
                    }
                )
                busy = await service.request("config.get")
                assert busy["error"]["code"] == "configuration_busy"  # the write runs
                turn = await service.request("turn.start", {"prompt": "go"})
                assert turn["error"] is None, turn
                lock.release()
                events = await service.events_until_terminal(turn["request_id"])
                assert events[-1]["payload"]["status"] == "completed"
                assert events[-1]["payload"]["assistant_text"] == "ran"
                written = await service.response_for(write_id)
                assert written["payload"]["persisted"] is True, written


# Both modes: files are read as the service process (embedded) or the daemon.
@pytest.mark.both_modes
async def test_unreadable_settings_and_auth_give_fixed_errors(home: Path, project: Path) -> None:
    (home / "settings.json").write_text('{"provider": 42, "secret-looking": "sk-live-XYZ"')
    async with running_service(home, project) as service:
        status = await service.request("status")
        assert status["error"]["code"] == "internal_error"
        config = await service.request("config.get")
        assert config["error"]["code"] == "configuration_unavailable"
        (home / "settings.json").write_text("{}")
        assert (await service.request("status"))["error"] is None
        (home / "auth.json").write_text("garbage")
        (home / "auth.json").chmod(0o600)
        auth = await service.request("auth.status")
        assert auth["error"]["code"] == "internal_error"
        assert (await service.request("status"))["error"]["code"] == "internal_error"
        seen = json.dumps([status, config, auth])
    assert "sk-live-XYZ" not in seen and str(home) not in seen
