"""Import every product module, and warm what every turn uses, before the daemon is ready.

A daemon lives for days, and an upgrade replaces its files on disk underneath it: a
module first imported after the upgrade would be new code on top of old modules. So the
daemon loads at start-up every module of ``magi_code`` it could ever run, and nothing of
the product is imported later. That is all of it but the frontends' side
(:data:`NEVER_RUN`): the layer rules (``README.md``'s layers, ``tests/unit/test_layers.py``)
keep those packages from the daemon and from every layer it builds on, so no code the
daemon runs can import them, and loading them (the ACP agent, the command line, the
client) would only delay its first answer. Third-party SDKs that a product module
imports only on use are the documented exception (``docs/unix-daemon.md``, "Upgrades"):
today the MCP SDK, which ``magi_code.tools.mcp`` imports only when a turn's settings
configure an MCP server (it costs ~0.5 s and ~35 MiB, so a daemon whose turns use none
never loads it).

The parts of the HTTP stack that ``httpx`` loads only on the first request
(``httpcore``'s connection pool, ``h11``, ``anyio``'s asyncio backend, ``certifi``'s bundle
path: ``turns.runtime.TURN_MODULES``) are third-party code that no upgrade guarantee
covers: the daemon imports them right after it is ready (``lifecycle``), once its first
client has been answered, so they cost a cold start nothing and a first turn that comes
later than that nothing either.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator
from typing import Final

import magi_code

# The frontends' packages and modules, which the daemon never imports (see above).
NEVER_RUN: Final = frozenset(
    {"stdio", "client", "shim", "acp", "oneshot", "daemonctl", "cli", "__main__"}
)
# Entry points that run on import, not library code.
SKIPPED: Final = frozenset({"magi_code.daemon.__main__"})


def import_product_modules() -> list[str]:
    """Import every module the daemon could run; returns their names, sorted."""
    names = [name for name in _daemon_modules() if name not in SKIPPED]
    for name in names:
        # ``__import__``, not importlib.import_module: ``-X importtime`` reports only the
        # former, and the daemon's imports are checked that way (tests/process).
        __import__(name)
    return sorted(names)


def _daemon_modules() -> Iterator[str]:
    for info in pkgutil.iter_modules(magi_code.__path__, "magi_code."):
        if info.name.removeprefix("magi_code.") in NEVER_RUN:
            continue
        yield info.name
        if info.ispkg:
            # Walking a package imports it and each package under it, as the loop would.
            __import__(info.name)
            package = getattr(magi_code, info.name.removeprefix("magi_code."))
            yield from (i.name for i in pkgutil.walk_packages(package.__path__, f"{info.name}."))
