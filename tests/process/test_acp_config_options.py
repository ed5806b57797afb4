"""Session config options of ``magi-code --app acp`` (the model and the reasoning level,
ACP's stable ``configOptions``), with the official ACP SDK as the editor, in both service
modes: ``session/new`` offers the provider's catalog models, ``session/set_config_option``
gives the session its own model in the core (RFC-0002 §6.15) that its next turns use,
other sessions and the settings files are untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from acp.exceptions import RequestError

from tests.process.acp_support import acp_agent, text_prompt
from tests.process.turn_support import posted_bodies, write_settings
from tests.support.fake_providers import FakeModel, FakeProviderServer, Reply
from tests.support.service import running_service

pytestmark = pytest.mark.both_modes


def _options(config: list[Any]) -> dict[str, dict[str, Any]]:
    dumped = [o.model_dump(mode="json", by_alias=True, exclude_unset=True) for o in config]
    return {o["id"]: o for o in dumped}


async def test_the_model_option_is_the_sessions_own_model(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    fake.models = [FakeModel("m1", "One", 32_000, 4096), FakeModel("m2", "Two", 64_000, 4096)]
    write_settings(home, fake)
    settings_before = (home / "settings.json").read_text()
    async with running_service(home, project) as v1:
        refreshed = await v1.request("catalog.refresh", {"provider_id": "local"})
        assert refreshed["payload"]["state"] == "fresh_cache"
    fake.enqueue(Reply(text=["from two"]), Reply(text=["from one"]))
    async with acp_agent(home, project) as (conn, _editor):
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(project), mcp_servers=[])
        options = _options(new.config_options or [])
        assert options["model"]["category"] == "model"
        assert options["model"]["currentValue"] == "m1"
        assert [o["value"] for o in options["model"]["options"]] == ["m1", "m2"]
        assert options["thought_level"]["currentValue"] == "default"
        assert "default" in [o["value"] for o in options["thought_level"]["options"]]

        changed = await conn.set_config_option(
            config_id="model", session_id=new.session_id, value="m2"
        )
        assert _options(changed.config_options)["model"]["currentValue"] == "m2"
        await conn.prompt(session_id=new.session_id, prompt=text_prompt("hi"))
        # Another session still has the settings' model.
        other = await conn.new_session(cwd=str(project), mcp_servers=[])
        assert _options(other.config_options or [])["model"]["currentValue"] == "m1"
        await conn.prompt(session_id=other.session_id, prompt=text_prompt("hi"))
        assert [body["model"] for body in posted_bodies(fake)] == ["m2", "m1"]

        # A model the catalog does not have, and an unknown option: -32602.
        for config_id, value in (("model", "m9"), ("colour", "blue")):
            with pytest.raises(RequestError) as refused:
                await conn.set_config_option(
                    config_id=config_id, session_id=new.session_id, value=value
                )
            assert refused.value.code == -32602
    assert json.loads((home / "settings.json").read_text()) == json.loads(settings_before)
