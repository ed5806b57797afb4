"""Settings capture at turn admission: one preparation worker, never overlapping a write."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from magi_code.core.settings_gate import SettingsGate
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext
from magi_code.turns.runtime import PreparedSettings, prepare_settings


async def test_captures_queue_behind_each_other_and_writes_are_refused_meanwhile() -> None:
    gate = SettingsGate()
    order: list[str] = []
    release = asyncio.Event()

    async def capture(name: str) -> None:
        async with gate.capture():
            order.append(name)
            await release.wait()

    first = asyncio.create_task(capture("a"))
    second = asyncio.create_task(capture("b"))
    await asyncio.sleep(0)
    with pytest.raises(ServiceError) as refused, gate.write():
        pass
    assert refused.value.code is ErrorCode.CONFIGURATION_BUSY
    release.set()
    await asyncio.gather(first, second)
    assert order == ["a", "b"]
    with gate.write(), pytest.raises(ServiceError):
        async with gate.capture():
            pass


def test_capture_reads_the_merged_settings(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    (project / ".magi-code").mkdir(parents=True)
    (home / "settings.json").write_text('{"provider": "anthropic", "model": "global-model"}')
    (project / ".magi-code" / "settings.json").write_text('{"model": "project-model"}')
    prepared = prepare_settings(LaunchContext(home, project, {}))
    assert isinstance(prepared, PreparedSettings)
    assert prepared.effective.model_id == "project-model"
    bare = tmp_path / "bare-project"
    bare.mkdir()
    assert isinstance(prepare_settings(LaunchContext(home, bare, {})), PreparedSettings)
    assert list(bare.iterdir()) == []  # capture never creates files in a project


def test_capture_is_busy_while_another_process_writes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from magi_code.storage.files import locked\n"
            f"with locked(Path({str(home / 'settings.json')!r})):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ServiceError) as busy:
            prepare_settings(LaunchContext(home, tmp_path, {}))
        assert busy.value.code is ErrorCode.CONFIGURATION_BUSY
    finally:
        holder.kill()
        holder.wait()
    assert isinstance(prepare_settings(LaunchContext(home, tmp_path, {})), PreparedSettings)
