"""A project's ``.magi-code`` that is a symlink to a directory outside the project is not
followed (embedded and daemon modes): turns run on the global settings, and nothing out
there is read as the project's settings, instructions or skills, locked, or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.process.daemon.support import persistent
from tests.process.turn_support import body_text, posted_bodies, run_turn, write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import running_service

# Both modes: project files are read by the service process (embedded) or the daemon.
pytestmark = pytest.mark.both_modes

MARKERS = ("OUTSIDE-INSTRUCTIONS", "OUTSIDE-AGENTS", "outside-skill")


def _plant(target: Path) -> None:
    """What a project's ``.magi-code`` would hold, in ``target`` (not ``$MC_HOME``)."""
    target.mkdir()
    # Project settings that would select another model.
    (target / "settings.json").write_text(json.dumps({"model": "outside-model"}))
    skill = target / "skills" / "outside-skill"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: outside-skill\ndescription: 'x'\n---\nbody\n")


@pytest.mark.parametrize("target", ["mc-home", "elsewhere"])
async def test_a_magi_code_symlink_out_of_the_project_is_not_followed(
    home: Path,
    project: Path,
    tmp_path: Path,
    fake: FakeProviderServer,
    service_mode: str,
    target: str,
) -> None:
    write_settings(home, fake)
    outside = home if target == "mc-home" else tmp_path / target
    if outside != home:
        _plant(outside)
    (outside / "instructions.md").write_text("OUTSIDE-INSTRUCTIONS\n")
    (outside / "AGENTS.md").write_text("OUTSIDE-AGENTS\n")
    (project / ".magi-code").symlink_to(outside, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}
    fake.enqueue(Reply(text=["v1 ran"]))
    fake.enqueue(Reply(text=["v2 ran"]))
    async with running_service(home, project) as service:
        _, turn = await run_turn(service, "hello")
        assert turn.terminal["status"] == "completed", turn.terminal
        write = await service.request(
            "config.set",
            {"scope": "project", "selection": {"provider_id": "local", "model_id": "m1"}},
        )
        assert write["error"]["code"] == "settings_write_failed", write
        if service_mode == "daemon":
            # A persistent client's admission captures settings under the files' locks.
            client = await persistent(home, project)
            try:
                started = await client.request("turn.start", {"prompt": "again"})
                assert started["error"] is None, started
                async for event in client.events():
                    if event["event"] == "turn.terminal":
                        assert event["payload"]["status"] == "completed", event
                        break
            finally:
                await client.close()
    bodies = posted_bodies(fake)
    assert len(bodies) == (2 if service_mode == "daemon" else 1)
    for body in bodies:
        assert body["model"] == "m1"
        prompt = body_text(body)
        for marker in MARKERS:
            assert marker not in prompt
    after = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}
    if outside == home:
        # Only the home's own files may change (the generated settings schema); the home
        # settings file is the global one, never written as project settings.
        assert after["settings.json"] == before["settings.json"]
    else:
        assert after == before  # nothing locked (no lock file), written or created
