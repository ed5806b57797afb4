"""``magi-code daemon install|uninstall`` as real processes, in a throwaway user's home.

Every run sets both ``HOME`` and ``XDG_CONFIG_HOME`` (to a temporary path, or to "" for
the ``$HOME/.config`` fallback), so nothing here can touch the real user's units.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from magi_code.daemonctl.units import UNIT_MARKER
from tests.process.daemon.support import cli

UNIT = "systemd/user/magi-code.service"
pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the systemd user unit")


@pytest.fixture
def user(tmp_path: Path) -> Path:
    """A user home with an (empty, pre-existing) config home, as a login has."""
    home = tmp_path / "installer-home"
    (home / "xdg-config").mkdir(parents=True)
    return home


def run(
    home: Path, user: Path, *args: str, xdg: str | None = None
) -> subprocess.CompletedProcess[str]:
    config = str(user / "xdg-config") if xdg is None else xdg
    return cli(home, "daemon", *args, extra={"HOME": str(user), "XDG_CONFIG_HOME": config})


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: its kind, and a file's content or a link's target."""
    found: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = f"link:{os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = f"file:{path.read_text()}"
    return found


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("magi-code: "), result.stderr
    return lines[0]


def test_install_writes_under_xdg_config_home_what_print_shows(home: Path, user: Path) -> None:
    printed = run(home, user, "install", "--print")
    assert printed.returncode == 0, printed.stderr
    written = run(home, user, "install")
    assert written.returncode == 0, written.stderr
    unit = user / "xdg-config" / UNIT
    assert unit.read_text() == printed.stdout
    assert unit.stat().st_mode & 0o777 == 0o644
    assert not (user / ".config").exists()
    assert f"Installed {unit}." in written.stdout
    assert "systemctl --user daemon-reload && systemctl --user enable --now" in written.stdout
    assert f"MC_HOME={home}" in printed.stdout and "Type=notify" in printed.stdout


@pytest.mark.parametrize("xdg", ["", "relative/config"])
def test_without_an_absolute_xdg_config_home_install_uses_home_config(
    home: Path, user: Path, xdg: str
) -> None:
    result = run(home, user, "install", xdg=xdg)
    assert result.returncode == 0, result.stderr
    assert (user / ".config" / UNIT).is_file()
    assert not (user / "xdg-config" / "systemd").exists()
    assert run(home, user, "uninstall", xdg=xdg).returncode == 0
    # The config home itself is never removed, even one that install created.
    assert tree(user) == {"xdg-config": "dir", ".config": "dir"}


def test_install_refuses_to_replace_a_different_file_unless_forced(home: Path, user: Path) -> None:
    unit = user / "xdg-config" / UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/bin/my-own-magi-code\n")
    before = unit.stat()
    refused = run(home, user, "install")
    assert refused.returncode == 1
    line = one_error_line(refused)
    assert str(unit) in line and "--force" in line
    assert refused.stdout == ""
    assert unit.read_text() == "[Service]\nExecStart=/usr/bin/my-own-magi-code\n"
    assert (unit.stat().st_ino, unit.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    forced = run(home, user, "install", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"Replaced {unit}." in forced.stdout
    assert "systemctl --user restart magi-code.service" in forced.stdout
    assert unit.read_text() == run(home, user, "install", "--print").stdout


def test_reinstalling_the_same_unit_is_a_no_op(home: Path, user: Path) -> None:
    assert run(home, user, "install").returncode == 0
    unit = user / "xdg-config" / UNIT
    before = unit.stat()
    again = run(home, user, "install")
    assert again.returncode == 0, again.stderr
    assert "already installed (unchanged)" in again.stdout
    assert (unit.stat().st_ino, unit.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # Another MC_HOME renders another unit: that one differs and is refused.
    other = home.parent / "mc-home-other"
    other.mkdir()
    assert run(other, user, "install").returncode == 1
    assert f"MC_HOME={home}" in unit.read_text()


def test_install_then_uninstall_leaves_nothing_behind(home: Path, user: Path) -> None:
    before = tree(user)
    assert run(home, user, "install").returncode == 0
    assert tree(user) != before
    removed = run(home, user, "uninstall")
    assert removed.returncode == 0, removed.stderr
    assert tree(user) == before
    assert f"Removed {user / 'xdg-config' / UNIT}" in removed.stdout
    assert "systemctl --user daemon-reload" in removed.stdout


def test_uninstall_keeps_directories_that_hold_anything_else(home: Path, user: Path) -> None:
    assert run(home, user, "install").returncode == 0
    mine = user / "xdg-config/systemd/user/my.service"
    mine.write_text("[Service]\n")
    assert run(home, user, "uninstall").returncode == 0
    assert tree(user / "xdg-config") == {
        "systemd": "dir",
        "systemd/user": "dir",
        "systemd/user/my.service": "file:[Service]\n",
    }


def test_uninstall_of_nothing_installed_says_so(home: Path, user: Path) -> None:
    result = run(home, user, "uninstall")
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stdout
    assert tree(user) == {"xdg-config": "dir"}


def test_uninstall_refuses_a_file_it_did_not_write_unless_forced(home: Path, user: Path) -> None:
    unit = user / "xdg-config" / UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/bin/true\n")
    refused = run(home, user, "uninstall")
    assert refused.returncode == 1
    line = one_error_line(refused)
    assert str(unit) in line and "--force" in line and "nothing was removed" in line
    assert unit.read_text() == "[Service]\nExecStart=/usr/bin/true\n"
    forced = run(home, user, "uninstall", "--force")
    assert forced.returncode == 0, forced.stderr
    assert tree(user) == {"xdg-config": "dir"}


def test_an_edited_unit_that_keeps_the_marker_is_still_ours(home: Path, user: Path) -> None:
    assert run(home, user, "install").returncode == 0
    unit = user / "xdg-config" / UNIT
    assert unit.read_text().startswith(f"# {UNIT_MARKER}\n")
    unit.write_text(unit.read_text() + "Environment=MC_DAEMON_IDLE_SECONDS=600\n")
    assert run(home, user, "uninstall").returncode == 0
    assert not unit.exists()


def test_an_enabled_unit_is_refused_and_forced_removal_takes_its_links(
    home: Path, user: Path
) -> None:
    before = tree(user)
    assert run(home, user, "install").returncode == 0
    unit = user / "xdg-config" / UNIT
    wants = unit.parent / "default.target.wants"
    wants.mkdir()
    (wants / "magi-code.service").symlink_to(unit)  # what `systemctl --user enable` makes
    refused = run(home, user, "uninstall")
    assert refused.returncode == 1
    line = one_error_line(refused)
    assert "systemctl --user disable --now magi-code.service" in line
    assert unit.exists() and (wants / "magi-code.service").is_symlink()
    forced = run(home, user, "uninstall", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"Removed {wants / 'magi-code.service'}" in forced.stdout
    assert "systemctl --user stop magi-code.service" in forced.stdout
    assert tree(user) == before


def test_without_any_usable_home_install_and_uninstall_fail_in_one_line(home: Path) -> None:
    for action in ("install", "uninstall"):
        result = cli(home, "daemon", action, extra={"HOME": "relative", "XDG_CONFIG_HOME": ""})
        assert result.returncode == 1
        assert "install --print" in one_error_line(result)
