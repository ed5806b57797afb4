"""The installed package: its version (``server_version``) and its build identity.

The build identity tells two installed copies apart even when their versions agree
(an editable checkout, a re-installed wheel): a client whose build differs from the
running daemon's has the daemon replaced (see ``docs/unix-daemon.md``, "Upgrades").
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Final

BUILD_DIGEST_CHARS: Final = 16


@functools.cache
def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("magi-code")
    except PackageNotFoundError:
        return "0.0.0"


@functools.cache
def build_id() -> str:
    """``<version>+<digest>``: the version and a digest of every file of this package.

    Computed once per process from the files as installed (paths and contents, byte
    caches excluded), so it changes with any upgrade, downgrade or edit.
    """
    root = os.path.dirname(os.path.realpath(__file__))
    digest = hashlib.sha256()
    # os.walk, not pathlib: this runs in every shim start, where pathlib costs ~10 ms.
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(name for name in subdirs if name != "__pycache__")
        for name in sorted(names):
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                data = file.read()
            digest.update(os.path.relpath(path, root).encode())
            digest.update(b"\0%d\0" % len(data))
            digest.update(data)
    return f"{package_version()}+{digest.hexdigest()[:BUILD_DIGEST_CHARS]}"
