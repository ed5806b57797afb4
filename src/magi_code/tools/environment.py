"""The environment tool and MCP child processes run with.

Children run model-chosen commands as our own user, so anything that lets them find and
drive the service is removed: the daemon socket and runtime directory overrides, the
service's own switches, ``MC_HOME`` (the runtime home a daemon is keyed on), and every
credential variable the service reads. What a developer's tools need (``PATH``, ``HOME``,
``LANG``, toolchain variables) is kept.

Stripping ``MC_HOME`` means a ``magi-code`` started by a tool falls back to the default
home: it does not inherit a non-default daemon, but with the default home it can still
reach the user's daemon like any other process of that user (the daemon's peer-UID check
admits same-UID peers). Stripping is about not handing children the keys, not a sandbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

STRIPPED_NAMES: Final = frozenset(
    {
        "MC_HOME",
        "MC_DAEMON_SOCKET",
        "MC_RUNTIME_DIR",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_API_KEY",
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
