"""Import every product module before the daemon reports ready.

A daemon lives for days, and an upgrade replaces its files on disk underneath it: a
module first imported after the upgrade would be new code on top of old modules. So the
daemon loads all of ``magi_code`` at start-up, and nothing of the product is imported
later. Third-party SDKs that a product module imports only on use (none today) are the
documented exception (``docs/unix-daemon.md``, "Upgrades").
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Final

import magi_code

# Entry points that run on import, not library code.
SKIPPED: Final = frozenset({"magi_code.__main__"})


def import_product_modules() -> list[str]:
    """Import every module of the installed package; returns their names, sorted."""
    names = [
        info.name
        for info in pkgutil.walk_packages(magi_code.__path__, "magi_code.")
        if info.name not in SKIPPED
    ]
    for name in names:
        importlib.import_module(name)
    return sorted(names)
