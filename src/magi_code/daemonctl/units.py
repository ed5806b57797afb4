"""Service-manager units that run ``magi-code daemon run`` (systemd user unit, LaunchAgent).

No socket activation: the daemon binds its own socket under the lifetime lock, which stays
the single launch authority whether systemd, launchd or an on-demand client starts it
(GnuPG dropped its socket units for exactly this race, T6336). A clean idle exit (status 0)
stays down; a crash is restarted.

The files shipped in ``systemd/`` and ``launchd/`` are :func:`render_unit` output for the
placeholders in :data:`SHIPPED_PLACEHOLDERS` (a test keeps them identical).
"""

from __future__ import annotations

import plistlib
import shlex
from pathlib import Path, PurePosixPath
from typing import Final

SYSTEMD_UNIT_NAME: Final = "magi-code.service"
LAUNCHD_LABEL: Final = "com.magi-code.daemon"
LAUNCHD_PLIST_NAME: Final = f"{LAUNCHD_LABEL}.plist"
SYSTEMD_ENABLE_COMMAND: Final = (
    f"systemctl --user daemon-reload && systemctl --user enable --now {SYSTEMD_UNIT_NAME}"
)
STOP_TIMEOUT_SECONDS: Final = 120  # SIGTERM drains turns and persists terminal records

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


def install_target(platform: str, home: Path) -> Path:
    """Where the unit goes for the user whose home directory is ``home``."""
    if platform == "linux":
        return home / ".config" / "systemd" / "user" / SYSTEMD_UNIT_NAME
    if platform == "darwin":
        return home / "Library" / "LaunchAgents" / LAUNCHD_PLIST_NAME
    raise ValueError("no service-manager unit for this platform")


def enable_instructions(platform: str, target: Path) -> str:
    """Human instructions to load the installed unit at ``target``."""
    if platform == "linux":
        return (
            f"Installed {target}.\n"
            "Enable and start it with:\n"
            f"  {SYSTEMD_ENABLE_COMMAND}\n"
            "To keep turns running after you log out:\n"
            '  loginctl enable-linger "$USER"\n'
        )
    if platform == "darwin":
        return (
            f"Installed {target}.\n"
            "Load and start it with:\n"
            f"  launchctl bootstrap gui/$(id -u) {shlex.quote(str(target))}\n"
            "Restart it later with:\n"
            f"  launchctl kickstart -k gui/$(id -u)/{LAUNCHD_LABEL}\n"
        )
    raise ValueError("no service-manager unit for this platform")


def _systemd_unit(executable: str, mc_home: str) -> str:
    return (
        "# magi-code per-user daemon. Install: magi-code daemon install\n"
        "# (or copy to ~/.config/systemd/user/ and edit the paths), then:\n"
        f"#   {SYSTEMD_ENABLE_COMMAND}\n"
        "# No socket unit: the daemon's lifetime lock is the only launch authority.\n"
        "\n"
        "[Unit]\n"
        "Description=magi-code per-user agent daemon\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={_systemd_exec_word(executable)} daemon run\n"
        f"Environment={_systemd_quote('MC_HOME=' + mc_home, dollar=False)}\n"
        "Restart=on-failure\n"
        "RestartSec=2\n"
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
        # Restart after a crash or a failing exit; a clean idle exit stays down.
        "KeepAlive": {"Crashed": True, "SuccessfulExit": False},
        "ProcessType": "Interactive",
        "ExitTimeOut": STOP_TIMEOUT_SECONDS,
        "StandardOutPath": f"{mc_home}/launchd.log",
        "StandardErrorPath": f"{mc_home}/launchd.log",
    }
    return plistlib.dumps(plist, fmt=plistlib.FMT_XML, sort_keys=False).decode("utf-8")
