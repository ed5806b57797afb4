"""Import every product module, and warm what every turn uses, before the daemon is ready.

A daemon lives for days, and an upgrade replaces its files on disk underneath it: a
module first imported after the upgrade would be new code on top of old modules. So the
daemon loads all of ``magi_code`` at start-up, and nothing of the product is imported
later. Third-party SDKs that a product module imports only on use are the documented
exception (``docs/unix-daemon.md``, "Upgrades"): today the MCP SDK, which
``magi_code.tools.mcp`` imports only when a turn's settings configure an MCP server (it
costs ~0.5 s and ~35 MiB, so a daemon whose turns use none never loads it).

The parts of the HTTP stack that ``httpx`` loads only on the first request
(``httpcore``'s connection pool, ``h11``, ``anyio``'s asyncio backend, ``certifi``'s bundle
path: ``turns.runtime.TURN_MODULES``) are third-party code that no upgrade guarantee
covers: the daemon imports them right after it is ready (``lifecycle``), once its first
client has been answered, so they cost a cold start nothing and a first turn that comes
later than that nothing either.
"""

from __future__ import annotations

import pkgutil
from typing import Final

import magi_code

# Entry points that run on import, not library code.
SKIPPED: Final = frozenset({"magi_code.__main__", "magi_code.daemon.__main__"})


def import_product_modules() -> list[str]:
    """Import every module of the installed package; returns their names, sorted."""
    names = [
        info.name
        for info in pkgutil.walk_packages(magi_code.__path__, "magi_code.")
        if info.name not in SKIPPED
    ]
    for name in names:
        # ``__import__``, not importlib.import_module: ``-X importtime`` reports only the
        # former, and the daemon's imports are checked that way (tests/process).
        __import__(name)
    return sorted(names)
