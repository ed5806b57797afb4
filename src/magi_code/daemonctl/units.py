"""Service-manager units that run ``magi-code daemon run`` (systemd user unit, LaunchAgent).

No socket activation: the daemon binds its own socket under the lifetime lock, which stays
the single launch authority whether systemd, launchd or an on-demand client starts it
(GnuPG dropped its socket units for exactly this race, T6336).

The systemd unit is ``Type=notify``: the daemon says ``READY=1`` once its socket answers
and ``STOPPING=1`` when it decides to stop (``daemon/notify.py``). Exit statuses: 0 (a
clean stop or idle exit) stays down; 75 (stopped to be replaced) is clean and restarted;
2 (unusable runtime directory) and 3 (another daemon holds the lock) are failures that
are never restarted, since restarting cannot fix either; anything else, a crash
included, is restarted. launchd has no per-status rule: see ``docs/unix-daemon.md``.

Every rendered unit carries :data:`UNIT_MARKER` near its top: ``daemon uninstall``
removes only a file that does.

The files shipped in ``systemd/`` and ``launchd/`` are :func:`render_unit` output for the
placeholders in :data:`SHIPPED_PLACEHOLDERS` (a test keeps them identical).
"""

from __future__ import annotations

import os
import plistlib
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Final

from magi_code.daemon.exits import EXIT_ALREADY_RUNNING, EXIT_RESTART, EXIT_UNSAFE

SYSTEMD_UNIT_NAME: Final = "magi-code.service"
LAUNCHD_LABEL: Final = "com.magi-code.daemon"
LAUNCHD_PLIST_NAME: Final = f"{LAUNCHD_LABEL}.plist"
SYSTEMD_ENABLE_COMMAND: Final = (
    f"systemctl --user daemon-reload && systemctl --user enable --now {SYSTEMD_UNIT_NAME}"
)
STOP_TIMEOUT_SECONDS: Final = 120  # SIGTERM drains turns and persists terminal records
RESTART_SECONDS: Final = 2
# launchd respawns a job at most this often (and one that ran shorter only this long
# after it started): a daemon that exits 2 or 3 at once is retried twice a minute.
LAUNCHD_THROTTLE_SECONDS: Final = 30
# Stable across versions: ``daemon uninstall`` removes only a file with this comment.
UNIT_MARKER: Final = "magi-code-unit: written by magi-code daemon install (uninstall removes it)"
_MARKER_LINES: Final = (f"# {UNIT_MARKER}", f"<!-- {UNIT_MARKER} -->")

SHIPPED_PLACEHOLDERS: Final[dict[str, tuple[str, PurePosixPath]]] = {
    "linux": ("/usr/local/bin/magi-code", PurePosixPath("/home/USER/.magi-code")),
    "darwin": ("/usr/local/bin/magi-code", PurePosixPath("/Users/USER/.magi-code")),
}


def render_unit(platform: str, executable: str, mc_home: PurePosixPath | Path) -> tuple[str, str]:
    """``(file name, content)`` of the unit for ``platform`` ("linux" or "darwin").

    ``executable`` and ``mc_home`` must be absolute (service managers expand no ``~``).
    """
    if not executable.startswith("/") or not PurePosixPath(mc_home).is_absolute():
        raise ValueError("executable and MC_HOME must be absolute paths")
    if any(ch in f"{executable}{mc_home}" for ch in "\n\r\0"):
        raise ValueError("paths must not contain control characters")
    if platform == "linux":
        return SYSTEMD_UNIT_NAME, _systemd_unit(executable, str(mc_home))
    if platform == "darwin":
        return LAUNCHD_PLIST_NAME, _launchd_plist(executable, str(mc_home))
    raise ValueError("no service-manager unit for this platform")


def install_target(platform: str, env: Mapping[str, str]) -> Path | None:
    """Where the unit goes for the user of ``env``; None when it names no usable home.

    Linux: ``$XDG_CONFIG_HOME/systemd/user/`` when that is absolute (the XDG rule: a
    relative value is ignored), else ``$HOME/.config/systemd/user/``. macOS:
    ``$HOME/Library/LaunchAgents/``.
    """
    if platform not in ("linux", "darwin"):
        raise ValueError("no service-manager unit for this platform")
    home = env.get("HOME", "")
    home_path = Path(home) if os.path.isabs(home) else None
    if platform == "darwin":
        return (
            None if home_path is None else home_path / "Library/LaunchAgents" / LAUNCHD_PLIST_NAME
        )
    xdg = env.get("XDG_CONFIG_HOME", "")
    config = Path(xdg) if os.path.isabs(xdg) else None
    if config is None and home_path is not None:
        config = home_path / ".config"
    return None if config is None else config / "systemd" / "user" / SYSTEMD_UNIT_NAME


def is_our_unit(content: str) -> bool:
    """True when ``content`` carries the marker every rendered unit has near its top."""
    return any(line.strip() in _MARKER_LINES for line in content.splitlines()[:4])


def enablement_links(target: Path) -> list[Path]:
    """The ``*.wants``/``*.requires`` symlinks beside ``target`` that point at it.

    ``systemctl --user enable`` makes one (``default.target.wants/magi-code.service``)
    for the ``WantedBy=`` line; a link to another file of that name is not ours.
    """
    links: list[Path] = []
    try:
        entries = sorted(target.parent.iterdir())
    except OSError:
        return links
    for directory in entries:
        if not directory.name.endswith((".wants", ".requires")):
            continue
        link = directory / target.name
        try:
            pointee = os.readlink(link)
        except OSError:
            continue  # no such entry, or not a symlink
        if os.path.normpath(os.path.join(directory, pointee)) == os.path.normpath(target):
            links.append(link)
    return links


def enable_instructions(platform: str, target: Path) -> str:
    """Human instructions to load the installed unit at ``target``."""
    if platform == "linux":
        return (
            "Enable and start it with:\n"
            f"  {SYSTEMD_ENABLE_COMMAND}\n"
            "To keep turns running after you log out:\n"
            '  loginctl enable-linger "$USER"\n'
        )
    if platform == "darwin":
        return (
            "Load and start it with:\n"
            f"  launchctl bootstrap gui/$(id -u) {shlex.quote(str(target))}\n"
            "Restart it later with:\n"
            f"  launchctl kickstart -k gui/$(id -u)/{LAUNCHD_LABEL}\n"
        )
    raise ValueError("no service-manager unit for this platform")


def reload_instructions(platform: str, target: Path) -> str:
    """How to apply a replaced unit to a daemon the service manager already runs."""
    if platform == "linux":
        return (
            "If it is running, apply the new unit with:\n"
            f"  systemctl --user daemon-reload && systemctl --user restart {SYSTEMD_UNIT_NAME}\n"
        )
    if platform == "darwin":
        return (
            "If it is loaded, apply the new file with:\n"
            f"  launchctl bootout gui/$(id -u)/{LAUNCHD_LABEL}\n"
            f"  launchctl bootstrap gui/$(id -u) {shlex.quote(str(target))}\n"
        )
    raise ValueError("no service-manager unit for this platform")


def _systemd_unit(executable: str, mc_home: str) -> str:
    return (
        f"# {UNIT_MARKER}\n"
        "# magi-code per-user daemon. Install: magi-code daemon install\n"
        "# (or copy to ~/.config/systemd/user/ and edit the paths), then:\n"
        f"#   {SYSTEMD_ENABLE_COMMAND}\n"
        "# No socket unit: the daemon's lifetime lock is the only launch authority.\n"
        "\n"
        "[Unit]\n"
        "Description=magi-code per-user agent daemon\n"
        "\n"
        "[Service]\n"
        # READY=1 once the socket answers, STOPPING=1 when it stops (NotifyAccess=main).
        "Type=notify\n"
        f"ExecStart={_systemd_exec_word(executable)} daemon run\n"
        f"Environment={_systemd_quote('MC_HOME=' + mc_home, dollar=False)}\n"
        "# Exit 0 (stopped, idle) stays down; 75 (stopped to be replaced) is clean and\n"
        "# restarted; 2 (unusable runtime directory) and 3 (another daemon holds the lock)\n"
        "# are not restarted; a crash or any other exit is.\n"
        "Restart=on-failure\n"
        f"RestartSec={RESTART_SECONDS}\n"
        f"RestartPreventExitStatus={EXIT_UNSAFE} {EXIT_ALREADY_RUNNING}\n"
        f"RestartForceExitStatus={EXIT_RESTART}\n"
        f"SuccessExitStatus={EXIT_RESTART}\n"
        # SIGTERM to the daemon alone (it cancels its tools); leftovers get SIGKILL after it exits.
        "KillMode=mixed\n"
        f"TimeoutStopSec={STOP_TIMEOUT_SECONDS}\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def _systemd_quote(value: str, *, dollar: bool) -> str:
    """A double-quoted systemd word with ``%`` specifiers (and, in commands, ``$``) escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if dollar:
        escaped = escaped.replace("$", "$$")
    return f'"{escaped}"'


def _systemd_exec_word(executable: str) -> str:
    if all(ch.isalnum() or ch in "/._-+" for ch in executable):
        return executable
    return _systemd_quote(executable, dollar=True)


def _launchd_plist(executable: str, mc_home: str) -> str:
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": [executable, "daemon", "run"],
        "EnvironmentVariables": {"MC_HOME": mc_home},
        "RunAtLoad": True,
        # Restart after a crash or any non-zero exit (75 included; 2 and 3 too, since
        # launchd has no per-status rule: throttled); a clean idle exit stays down.
        "KeepAlive": {"Crashed": True, "SuccessfulExit": False},
        "ThrottleInterval": LAUNCHD_THROTTLE_SECONDS,
        # Tools the user waits for (builds, tests) must not run throttled as Background.
        "ProcessType": "Interactive",
        "ExitTimeOut": STOP_TIMEOUT_SECONDS,
        "Umask": 0o077,  # plists have no octal: written as 63
        "StandardOutPath": f"{mc_home}/launchd.log",
        "StandardErrorPath": f"{mc_home}/launchd.log",
    }
    text = plistlib.dumps(plist, fmt=plistlib.FMT_XML, sort_keys=False).decode("utf-8")
    head, sep, body = text.partition("<plist ")
    return f"{head}<!-- {UNIT_MARKER} -->\n{sep}{body}"
