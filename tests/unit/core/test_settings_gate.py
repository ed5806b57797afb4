"""Settings capture at a persistent client's turn admission: one preparation worker,
never overlapping another capture or a write."""

from __future__ import annotations

from pathlib import Path

import pytest

from magi_code.core.settings_gate import SettingsGate
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.launch import LaunchContext
from magi_code.turns import runtime
from magi_code.turns.runtime import PreparedSettings, prepare_settings
from tests.support.settings_lock import settings_lock_held


def test_captures_and_writes_that_overlap_are_refused_not_queued() -> None:
    gate = SettingsGate()
    with gate.capture():
        for overlapping in (gate.capture, gate.write):
            with pytest.raises(ServiceError) as refused, overlapping():
                pass
            assert refused.value.code is ErrorCode.CONFIGURATION_BUSY
    with gate.write(), gate.write():  # writes of different files may overlap
        with pytest.raises(ServiceError) as refused, gate.capture():
            pass
        assert refused.value.code is ErrorCode.CONFIGURATION_BUSY
    with gate.capture():  # free again once each ended
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


def test_capture_is_busy_while_another_process_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How long a capture waits for a write is the setting; the test need not wait 2 s.
    monkeypatch.setattr(runtime, "SETTINGS_LOCK_WAIT", 0.1)
    home = tmp_path / "home"
    home.mkdir()
    with settings_lock_held(home / "settings.json"), pytest.raises(ServiceError) as busy:
        prepare_settings(LaunchContext(home, tmp_path, {}))
    assert busy.value.code is ErrorCode.CONFIGURATION_BUSY
    assert isinstance(prepare_settings(LaunchContext(home, tmp_path, {})), PreparedSettings)
