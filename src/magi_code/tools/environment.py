"""The environment tool and MCP child processes run with, and the daemon's own.

Children run model-chosen commands as our own user, so anything that lets them find and
drive the service is removed: the daemon socket and runtime directory overrides, the
service's own switches, ``MC_HOME`` (the runtime home a daemon is keyed on), a service
manager's ``NOTIFY_SOCKET`` and ``JOURNAL_STREAM``, and every credential variable the
service reads. What a developer's tools need (``PATH``, ``HOME``, ``LANG``, toolchain
variables) is kept.

Stripping ``MC_HOME`` means a ``magi-code`` started by a tool falls back to the default
home: it does not inherit a non-default daemon. A daemon refuses connections from its own
tools' processes whatever home they name (the tool barrier,
:mod:`magi_code.endpoint.ancestry`); a tool run by an embedded service descends from no
daemon and reaches the user's daemon like any other process of that user. Stripping is
about not handing children the keys, not a sandbox.

The daemon's *own* environment is the opposite rule, an allow-list
(:func:`daemon_environment`): what the process needs to run Python, find its runtime
files, read its ``MC_DAEMON_*`` settings and talk to the service manager that started it.
Every request uses its connection's launch environment, so nothing a starter brought
along (API keys, tokens, proxy credentials) has any use in the daemon, and keeping it
would expose it for the daemon's whole life (``/proc/<pid>/environ``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

STRIPPED_NAMES: Final = frozenset(
    {
        "MC_HOME",
        "MC_DAEMON_SOCKET",
        "MC_RUNTIME_DIR",
        "MC_BWRAP",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_API_KEY",
        # A service manager's channels to the service it started: never a tool's.
        "NOTIFY_SOCKET",
        "JOURNAL_STREAM",
    }
)
STRIPPED_PREFIXES: Final = ("MC_DAEMON_", "MC_SERVICE_", "MC_CODEX_")


def is_stripped(name: str, secret_names: frozenset[str] = frozenset()) -> bool:
    return name in STRIPPED_NAMES or name in secret_names or name.startswith(STRIPPED_PREFIXES)


def child_environment(
    env: Mapping[str, str], *, secret_names: Iterable[str] = ()
) -> dict[str, str]:
    """``env`` without the service's socket, runtime, mode and credential variables.

    ``secret_names`` adds names to drop, e.g. custom providers' ``api_key_env``.
    """
    secrets = frozenset(secret_names)
    return {key: value for key, value in env.items() if not is_stripped(key, secrets)}


# The daemon's own environment: the interpreter and dynamic loader, the user's identity,
# locale and time zone, where runtime files go, and the daemon's own settings.
DAEMON_NAMES: Final = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "XDG_RUNTIME_DIR",
        "MC_HOME",
        "MC_RUNTIME_DIR",
        "MC_BWRAP",
        "MC_LOG_LEVEL",
        "MC_LOG_FORMAT",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSAFEPATH",
        "PYTHONNOUSERSITE",
        "PYTHONUSERBASE",
        "PYTHONUTF8",
        "PYTHONIOENCODING",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPYCACHEPREFIX",
        "PYTHONWARNINGS",
        "PYTHONDEVMODE",
        "PYTHONFAULTHANDLER",
        "PYTHONHASHSEED",
        "PYTHONMALLOC",
        "LD_LIBRARY_PATH",
        "DYLD_LIBRARY_PATH",
        "DYLD_FALLBACK_LIBRARY_PATH",
        # systemd's readiness socket and journal stream, kept across the re-exec.
        "NOTIFY_SOCKET",
        "JOURNAL_STREAM",
    }
)
DAEMON_PREFIXES: Final = ("LC_", "MC_DAEMON_")


def is_daemon_variable(name: str) -> bool:
    return name in DAEMON_NAMES or name.startswith(DAEMON_PREFIXES)


def daemon_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``env``: all a daemon process keeps of its starter's."""
    return {key: value for key, value in env.items() if is_daemon_variable(key)}
