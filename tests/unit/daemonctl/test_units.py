"""Service-manager units: shipped files match the renderer, and the content is sound."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from magi_code.daemonctl.units import (
    LAUNCHD_LABEL,
    SHIPPED_PLACEHOLDERS,
    enable_instructions,
    install_target,
    render_unit,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = {"linux": REPO / "systemd", "darwin": REPO / "launchd"}


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_shipped_unit_is_the_rendered_placeholder(platform: str) -> None:
    executable, mc_home = SHIPPED_PLACEHOLDERS[platform]
    name, content = render_unit(platform, executable, mc_home)
    shipped = SHIPPED[platform] / name
    assert shipped.read_text(encoding="utf-8") == content
    assert sorted(p.name for p in SHIPPED[platform].iterdir()) == [name]


def systemd_directives(content: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in content.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_systemd_unit_runs_daemon_run_without_socket_activation() -> None:
    name, content = render_unit("linux", "/opt/mc/bin/magi-code", Path("/home/u/.magi-code"))
    assert name == "magi-code.service"
    d = systemd_directives(content)
    assert d["ExecStart"] == ["/opt/mc/bin/magi-code daemon run"]
    assert d["Type"] == ["simple"]
    assert d["Restart"] == ["on-failure"]
    assert d["KillMode"] == ["mixed"]
    assert d["Environment"] == ['"MC_HOME=/home/u/.magi-code"']
    assert "RestartSec" in d and "TimeoutStopSec" in d
    assert d["WantedBy"] == ["default.target"]
    assert "ListenStream" not in content and "Sockets" not in content


def test_systemd_quoting_disables_specifiers_and_expansion() -> None:
    _, content = render_unit("linux", "/opt/my apps/magi-code", Path('/home/u/100% "$X"'))
    d = systemd_directives(content)
    assert d["ExecStart"] == ['"/opt/my apps/magi-code" daemon run']
    assert d["Environment"] == ['"MC_HOME=/home/u/100%% \\"$X\\""']


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_accepts_the_unit(tmp_path: Path) -> None:
    name, content = render_unit("linux", sys.executable, tmp_path / "mc home %h")
    (tmp_path / name).write_text(content)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / name)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_launchd_plist_content() -> None:
    home = PurePosixPath("/Users/u/Magi & <Code>")
    name, content = render_unit("darwin", "/opt/mc/bin/magi-code", home)
    assert name == f"{LAUNCHD_LABEL}.plist"
    plist = plistlib.loads(content.encode())
    assert plist["Label"] == LAUNCHD_LABEL
    assert plist["ProgramArguments"] == ["/opt/mc/bin/magi-code", "daemon", "run"]
    assert plist["EnvironmentVariables"] == {"MC_HOME": str(home)}
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"Crashed": True, "SuccessfulExit": False}
    assert plist["ProcessType"] == "Interactive"
    assert plist["StandardErrorPath"].startswith("/")
    assert "Sockets" not in plist


@pytest.mark.parametrize(
    ("executable", "mc_home"),
    [("magi-code", "/h"), ("/bin/magi-code", "relative"), ("/bin/mc\n[Service]", "/h")],
)
def test_rejects_relative_or_multiline_paths(executable: str, mc_home: str) -> None:
    with pytest.raises(ValueError):
        render_unit("linux", executable, PurePosixPath(mc_home))


def test_install_targets_and_instructions(tmp_path: Path) -> None:
    linux = install_target("linux", tmp_path)
    darwin = install_target("darwin", tmp_path)
    assert linux == tmp_path / ".config/systemd/user/magi-code.service"
    assert darwin == tmp_path / "Library/LaunchAgents/com.magi-code.daemon.plist"
    assert (
        "systemctl --user daemon-reload && systemctl --user enable --now magi-code.service"
        in enable_instructions("linux", linux)
    )
    assert f"launchctl bootstrap gui/$(id -u) {darwin}" in enable_instructions("darwin", darwin)
    for call in (
        lambda: render_unit("win32", "/x", PurePosixPath("/h")),
        lambda: install_target("win32", tmp_path),
        lambda: enable_instructions("win32", linux),
    ):
        with pytest.raises(ValueError):
            call()
