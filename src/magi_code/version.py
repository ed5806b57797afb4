"""The installed package: its version (``server_version``) and its build identity.

The build identity tells two installed copies apart even when their versions agree
(an editable checkout, a re-installed wheel): a client whose build differs from the
running daemon's has the daemon replaced (see ``docs/unix-daemon.md``, "Upgrades").
"""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Final

BUILD_DIGEST_CHARS: Final = 16
DIST_NAME: Final = "magi-code"
# ``importlib.metadata``'s normalized form of DIST_NAME, as its directory names carry it.
_NORMALIZED: Final = "magi_code"
_FALLBACK_VERSION: Final = "0.0.0"


@functools.cache
def package_version() -> str:
    """The installed distribution's version, as ``importlib.metadata.version`` reports it.

    ``importlib.metadata`` costs ~10-25 ms to import, paid at every service start. So the
    distribution's metadata directory is looked up as its path finder would: the first
    entry of ``sys.path`` holding a ``magi_code-*.dist-info`` or ``magi_code*.egg-info``
    directory, whose ``METADATA`` (or ``PKG-INFO``) ``Version:`` header is the version.
    Anything this shortcut cannot decide the way the finder would (a zip archive on the
    path, two candidates in one directory, a metadata file without a version, no
    metadata at all) is left to ``importlib.metadata`` itself.
    """
    try:
        found = _version_from_path(sys.path)
    except _Undecided:
        found = None
    if found is not None:
        return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DIST_NAME)
    except PackageNotFoundError:
        return _FALLBACK_VERSION


class _Undecided(Exception):
    """The shortcut cannot tell what ``importlib.metadata`` would find."""


def _version_from_path(entries: list[str]) -> str | None:
    """The version from the first ``sys.path`` entry with our metadata; None if none has.

    Raises:
        _Undecided: see :func:`package_version`.
    """
    for entry in entries:
        directory = entry or "."
        try:
            names = os.listdir(directory)
        except NotADirectoryError:
            raise _Undecided from None  # a zip archive: importlib.metadata reads those
        except OSError:
            continue  # missing or unreadable: the finder skips it too
        candidates = [name for name in names if _is_ours(name)]
        if not candidates:
            continue
        if len(candidates) > 1:
            raise _Undecided
        return _metadata_version(os.path.join(directory, candidates[0]))
    return None


def _is_ours(name: str) -> bool:
    # As importlib.metadata's Lookup: the lower-cased stem before the first "-",
    # separators normalized, of a ".dist-info" or ".egg-info" entry.
    low = name.lower()
    if not low.endswith((".dist-info", ".egg-info")):
        return False
    stem = low.rpartition(".")[0].partition("-")[0]
    return re.sub(r"[-_.]+", "_", stem) == _NORMALIZED


def _metadata_version(path: str) -> str:
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, filename), encoding="utf-8") as file:
                text = file.read()
        except (NotADirectoryError, IsADirectoryError):
            raise _Undecided from None  # an egg-info file, not a directory
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError):
            raise _Undecided from None
        for line in text.splitlines():
            if not line.strip():
                break  # the headers end at the first blank line
            header, _, value = line.partition(":")
            if header.strip().lower() == "version" and value.strip():
                return value.strip()
        raise _Undecided
    raise _Undecided


@functools.cache
def build_id() -> str:
    """``<version>+<digest>``: the version and a digest of every file of this package.

    Computed once per process from the files as installed (paths and contents, byte
    caches excluded), so it changes with any upgrade, downgrade or edit.
    """
    import hashlib  # ~3 ms: only the daemon and its clients need a build identity

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
