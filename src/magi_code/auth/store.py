"""The protected shared auth store: ``$MC_HOME/auth.json``.

Format: ``{"version": 1, "providers": {"<id>": {"generation": N, "record": {...} | null}}}``.
Every write happens under the cross-process lock, re-reads the file, advances the
provider's generation and replaces the file atomically with mode 0600, so unrelated
records survive and a writer that raced another one can notice (``AuthChanged``).

Blocking functions: callers on the event loop run them in a worker thread.
Any failure to read or write raises ``ServiceError(INTERNAL_ERROR)`` raised ``from None``:
neither the message nor the exception chain carries the path or file content.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from magi_code.dataclass import dataclass, field
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.storage.files import atomic_write, locked, open_regular

STORE_VERSION: Final = 1
# Far above any real store (a handful of small records); bigger is treated as damage.
MAX_STORE_BYTES: Final = 1 << 20
LOCK_TIMEOUT_S: Final = 10.0


class AuthChanged(Exception):
    """The provider's generation moved since the caller observed it."""

    def __init__(self) -> None:
        super().__init__("auth_changed")


@dataclass(frozen=True, slots=True)
class AuthSnapshot:
    """One consistent read of the store: records (absent = ``None``) and generations."""

    records: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    generations: Mapping[str, int] = field(default_factory=dict)

    def record(self, provider_id: str) -> Mapping[str, Any] | None:
        return self.records.get(provider_id)

    def generation(self, provider_id: str) -> int:
        return self.generations.get(provider_id, 0)


def _internal() -> ServiceError:
    return ServiceError(ErrorCode.INTERNAL_ERROR)


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, ``None`` if it does not exist; refuses anything but a private file."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError:
        # ELOOP: the store is a symlink; NotRegularFileError: a FIFO, socket or directory
        # (refused without blocking). Anything else: unreadable. All are damage.
        raise _internal() from None
    try:
        info = os.fstat(fd)
        if info.st_mode & 0o077:
            raise _internal()
        if info.st_uid != os.getuid() or info.st_size > MAX_STORE_BYTES:
            raise _internal()
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, 65536):
            total += len(chunk)
            if total > MAX_STORE_BYTES:
                raise _internal()
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        raise _internal() from None
    finally:
        os.close(fd)


def _parse(data: bytes) -> dict[str, Any]:
    """Validate the document shape; returns it (with any unknown top-level keys kept)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise _internal() from None
    if not isinstance(doc, dict) or doc.get("version") != STORE_VERSION:
        raise _internal()
    providers = doc.get("providers")
    if not isinstance(providers, dict):
        raise _internal()
    for entry in providers.values():
        if not isinstance(entry, dict):
            raise _internal()
        gen = entry.get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
            raise _internal()
        record = entry.get("record")
        if record is not None and not (
            isinstance(record, dict) and isinstance(record.get("type"), str)
        ):
            raise _internal()
    return doc


def _snapshot(doc: Mapping[str, Any]) -> AuthSnapshot:
    records: dict[str, Mapping[str, Any]] = {}
    generations: dict[str, int] = {}
    for provider_id, entry in doc["providers"].items():
        generations[provider_id] = entry["generation"]
        if entry.get("record") is not None:
            records[provider_id] = entry["record"]
    return AuthSnapshot(records=records, generations=generations)


class AuthStore:
    """Reads and writes the shared auth file; safe across threads and processes."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __repr__(self) -> str:
        return "AuthStore(<auth store>)"  # never the path

    def read(self) -> AuthSnapshot:
        """Current records and generations; a missing file is an empty store."""
        return _snapshot(self._load())

    def commit(
        self,
        provider_id: str,
        record: Mapping[str, Any] | None,
        expected_generation: int | None,
    ) -> int:
        """Store ``record`` (``None`` clears it) and return the provider's new generation.

        With ``expected_generation`` the write only happens if the provider's generation
        is still that value under the lock; otherwise ``AuthChanged`` is raised.
        """
        generation, _ = self._write(provider_id, record, expected_generation)
        return generation

    def remove(self, provider_id: str) -> bool:
        """Logout: clear the record, advancing the generation even if there was none."""
        _, removed = self._write(provider_id, None, None)
        return removed

    def _load(self) -> dict[str, Any]:
        data = _read_bytes(self._path)
        if data is None:
            return {"version": STORE_VERSION, "providers": {}}
        return _parse(data)

    def _write(
        self,
        provider_id: str,
        record: Mapping[str, Any] | None,
        expected_generation: int | None,
    ) -> tuple[int, bool]:
        try:
            with locked(self._path, timeout=LOCK_TIMEOUT_S):
                doc = self._load()
                providers: dict[str, Any] = doc["providers"]
                entry = providers.get(provider_id) or {"generation": 0, "record": None}
                current = entry["generation"]
                if expected_generation is not None and current != expected_generation:
                    raise AuthChanged()
                removed = entry.get("record") is not None
                generation = current + 1
                providers[provider_id] = {
                    "generation": generation,
                    "record": dict(record) if record is not None else None,
                }
                data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
                atomic_write(self._path, data, mode=0o600)
        except (OSError, TypeError, ValueError):
            # Lock timeout (filelock's Timeout is an OSError), full disk, unserialisable
            # record: all one fixed failure.
            raise _internal() from None
        return generation, removed
