"""The installed package: its version (``server_version``) and its build identity.

The build identity tells two installed copies apart even when their versions agree
(an editable checkout, a re-installed wheel): a client whose build differs from the
running daemon's has the daemon replaced (see ``docs/unix-daemon.md``, "Upgrades").
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from typing import Final

BUILD_DIGEST_CHARS: Final = 16
DIST_NAME: Final = "magi-code"
# ``importlib.metadata``'s normalized form of DIST_NAME, as its directory names carry it.
_NORMALIZED: Final = "magi_code"
_FALLBACK_VERSION: Final = "0.0.0"
_CACHE_NAME: Final = "build-id"
_HEX_CHARS: Final = 64
_RACY_NS: Final = 2_000_000_000


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
    stem = low.rpartition(".")[0].partition("-")[0].replace("-", "_").replace(".", "_")
    while "__" in stem:  # runs of separators are one (``re`` would cost every start ~2 ms)
        stem = stem.replace("__", "_")
    return stem == _NORMALIZED


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
    caches excluded), so it changes with any upgrade, downgrade or edit, and two copies
    with the same files and version agree.
    """
    root = os.path.dirname(os.path.realpath(__file__))
    return f"{package_version()}+{package_digest(root)[:BUILD_DIGEST_CHARS]}"


def package_digest(root: str) -> str:
    """The SHA-256 of the files under ``root``, kept in ``__pycache__/build-id``.

    Reading and hashing every file costs a few ms on each shim start, so the digest is
    stored beside the stat signature of the files it was computed from and reused while
    that signature is unchanged: an edit, a copy or a re-install changes a file's size,
    mtime, ctime or inode (and ctime cannot be set back). A cache that cannot be read or
    written only costs the hashing.
    """
    files, signature, newest = _scan(root)
    cache = os.path.join(root, "__pycache__", _CACHE_NAME)
    try:
        with open(cache, "rb") as file:
            digest, _, cached = file.read().partition(b"\n")
        if signature and cached == signature and len(digest) == _HEX_CHARS:
            return digest.decode("ascii")
    except (OSError, UnicodeDecodeError):
        pass
    digest_text = _content_digest(files)
    # A file changed while it was read, or so recently that a next change could keep its
    # timestamps (their granularity): not cached, the next start hashes again.
    if _scan(root)[1] == signature and newest < time.time_ns() - _RACY_NS:
        _write_cache(cache, digest_text.encode("ascii") + b"\n" + signature)
    return digest_text


def _scan(root: str) -> tuple[list[tuple[str, str]], bytes, int]:
    """Every file under ``root`` but ``__pycache__`` as (relative path, path), in
    ``os.walk``'s order with sorted names (symlinked directories are not entered); their
    stat signature (empty when one cannot be read); the newest of their timestamps (ns).

    ``os.scandir`` by hand: this runs in every shim start, and ``os.walk`` with
    ``os.path.relpath`` and ``os.stat`` per file cost ~1 ms more.
    """
    files: list[tuple[str, str]] = []
    lines: list[str] = []
    newest = 0
    readable = True

    def walk(directory: str, prefix: str) -> None:
        nonlocal newest, readable
        try:
            with os.scandir(directory) as found:
                entries = sorted(found, key=_name)
        except OSError:
            return  # as os.walk: an unreadable directory has no files
        subdirs = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if entry.name != "__pycache__" and not entry.is_symlink():
                    subdirs.append(entry)
                continue
            relative = prefix + entry.name
            files.append((relative, entry.path))
            try:
                st = entry.stat()
            except OSError:
                readable = False  # hashing it fails too
                continue
            lines.append(
                f"{relative}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
                f"\0{st.st_ino}\0{st.st_dev}"
            )
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
        for entry in subdirs:
            walk(entry.path, f"{prefix}{entry.name}/")

    walk(root, "")
    signature = os.fsencode("\n".join(lines)) if readable else b""
    return files, signature, newest


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _content_digest(files: list[tuple[str, str]]) -> str:
    import hashlib  # ~3 ms (OpenSSL): only when the cache does not answer

    digest = hashlib.sha256()
    for relative, path in files:
        with open(path, "rb") as file:
            data = file.read()
        digest.update(relative.encode())
        digest.update(b"\0%d\0" % len(data))
        digest.update(data)
    return digest.hexdigest()


def _write_cache(path: str, data: bytes) -> None:
    """Replace the cache file atomically (concurrent starts may write it together)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
