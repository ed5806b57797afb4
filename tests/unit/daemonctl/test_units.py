"""Service-manager units: shipped files match the renderer, and the content is sound."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from magi_code.daemon import exits
from magi_code.daemonctl.units import (
    LAUNCHD_LABEL,
    SHIPPED_PLACEHOLDERS,
    UNIT_MARKER,
    enable_instructions,
    enablement_links,
    install_target,
    is_our_unit,
    reload_instructions,
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


def test_systemd_unit_is_notify_and_its_exit_statuses_never_loop() -> None:
    _, content = render_unit("linux", "/opt/mc/bin/magi-code", Path("/home/u/.magi-code"))
    d = systemd_directives(content)
    assert d["Type"] == ["notify"]
    assert "NotifyAccess" not in d  # the default, main: only the daemon itself is heard
    assert d["Restart"] == ["on-failure"]
    assert d["RestartSec"] == ["2"]
    # 2 (unusable runtime dir) and 3 (another daemon holds the lock): restarting cannot help.
    assert d["RestartPreventExitStatus"] == ["2 3"]
    # 75 (stopped to be replaced): a clean exit, and the manager starts the new build.
    assert d["RestartForceExitStatus"] == ["75"]
    assert d["SuccessExitStatus"] == ["75"]
    assert (exits.EXIT_UNSAFE, exits.EXIT_ALREADY_RUNNING) == (2, 3)


def _systemd_analyze(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze --user verify`` in a private, empty user environment."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_RUNTIME_DIR": str(runtime),  # --user needs one; no user manager is contacted
        "SYSTEMD_LOG_LEVEL": "notice",
        "SYSTEMD_PAGER": "",
    }
    return subprocess.run(
        ["systemd-analyze", "--user", "--man=no", "--generators=no", "verify", str(unit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _unit_complaints(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if "magi-code" in line]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_accepts_the_unit_with_the_real_executable(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "magi-code"
    if not os.access(script, os.X_OK):
        pytest.skip("no magi-code script beside this interpreter")
    units = tmp_path / "units"
    units.mkdir()
    name, content = render_unit("linux", str(script), tmp_path / "mc home %h")
    (units / name).write_text(content)
    result = _systemd_analyze(units / name, tmp_path)
    assert result.returncode == 0, result.stderr
    assert _unit_complaints(result) == [], result.stderr
    # The check sees what it is meant to: an unknown key is a warning naming the unit.
    (units / name).write_text(content.replace("Type=notify\n", "Type=notify\nBogus=1\n"))
    assert any(
        "Bogus" in line for line in _unit_complaints(_systemd_analyze(units / name, tmp_path))
    )


def test_every_rendered_unit_carries_the_marker_and_foreign_files_do_not() -> None:
    for platform in ("linux", "darwin"):
        _, content = render_unit(platform, "/opt/mc/bin/magi-code", PurePosixPath("/h"))
        assert UNIT_MARKER in content.splitlines()[0] + content.splitlines()[2]
        assert is_our_unit(content)
    assert render_unit("linux", "/x", PurePosixPath("/h"))[1].startswith(f"# {UNIT_MARKER}\n")
    assert not is_our_unit("[Service]\nExecStart=/usr/bin/true\n")
    assert not is_our_unit(f"[Service]\nExecStart=/usr/bin/true\n\n\n\n# {UNIT_MARKER}\n")
    assert not is_our_unit(f"# not {UNIT_MARKER}\n")


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
    assert plist["ThrottleInterval"] == 30  # an exit 2 or 3 is retried twice a minute
    assert plist["ProcessType"] == "Interactive"
    assert plist["Umask"] == 0o077
    assert "<integer>63</integer>" in content  # plists have no octal
    assert plist["ExitTimeOut"] == 120
    assert plist["StandardErrorPath"] == f"{home}/launchd.log"
    assert "Sockets" not in plist
    assert f"<!-- {UNIT_MARKER} -->\n<plist " in content


@pytest.mark.parametrize(
    ("executable", "mc_home"),
    [("magi-code", "/h"), ("/bin/magi-code", "relative"), ("/bin/mc\n[Service]", "/h")],
)
def test_rejects_relative_or_multiline_paths(executable: str, mc_home: str) -> None:
    with pytest.raises(ValueError):
        render_unit("linux", executable, PurePosixPath(mc_home))


def test_install_targets_and_instructions(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    linux = install_target("linux", env)
    darwin = install_target("darwin", env)
    assert linux == tmp_path / ".config/systemd/user/magi-code.service"
    assert darwin == tmp_path / "Library/LaunchAgents/com.magi-code.daemon.plist"
    assert (
        "systemctl --user daemon-reload && systemctl --user enable --now magi-code.service"
        in enable_instructions("linux", linux)
    )
    assert f"launchctl bootstrap gui/$(id -u) {darwin}" in enable_instructions("darwin", darwin)
    assert "systemctl --user restart magi-code.service" in reload_instructions("linux", linux)
    assert f"launchctl bootout gui/$(id -u)/{LAUNCHD_LABEL}" in reload_instructions(
        "darwin", darwin
    )
    for call in (
        lambda: render_unit("win32", "/x", PurePosixPath("/h")),
        lambda: install_target("win32", env),
        lambda: enable_instructions("win32", linux),
        lambda: reload_instructions("win32", linux),
    ):
        with pytest.raises(ValueError):
            call()


def test_install_target_follows_xdg_config_home_when_it_is_absolute(tmp_path: Path) -> None:
    config = tmp_path / "config"
    home = str(tmp_path / "home")
    unit = "systemd/user/magi-code.service"
    assert install_target("linux", {"HOME": home, "XDG_CONFIG_HOME": str(config)}) == (
        config / unit
    )
    assert install_target("linux", {"XDG_CONFIG_HOME": str(config)}) == config / unit
    # A relative or empty XDG_CONFIG_HOME is ignored (the XDG rule): $HOME/.config.
    for ignored in ("relative/config", ""):
        assert install_target("linux", {"HOME": home, "XDG_CONFIG_HOME": ignored}) == (
            Path(home) / ".config" / unit
        )
    # macOS agents live in ~/Library/LaunchAgents whatever XDG says.
    assert install_target("darwin", {"HOME": home, "XDG_CONFIG_HOME": str(config)}) == (
        Path(home) / "Library/LaunchAgents/com.magi-code.daemon.plist"
    )
    for env in ({}, {"HOME": "relative"}, {"XDG_CONFIG_HOME": "relative"}):
        assert install_target("linux", env) is None
        assert install_target("darwin", env) is None


def test_enablement_links_are_the_wants_links_to_this_file(tmp_path: Path) -> None:
    user = tmp_path / "systemd/user"
    wants = user / "default.target.wants"
    wants.mkdir(parents=True)
    target = user / "magi-code.service"
    target.write_text("unit")
    assert enablement_links(target) == []
    (wants / "magi-code.service").symlink_to(target)
    (user / "other.target.wants").mkdir()
    (user / "other.target.wants/magi-code.service").symlink_to(tmp_path / "elsewhere.service")
    (user / "x.requires").mkdir()
    (user / "x.requires/magi-code.service").symlink_to("../magi-code.service")  # relative
    (user / "y.wants").mkdir()
    (user / "y.wants/magi-code.service").write_text("a copy, not a link")
    assert enablement_links(target) == [
        wants / "magi-code.service",
        user / "x.requires/magi-code.service",
    ]
