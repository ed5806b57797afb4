"""Plain helpers shared by the config tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from magi_code.config.catalog import CatalogModel, write_catalog
from magi_code.config.settings import all_providers, load_settings
from magi_code.storage.launch import LaunchContext

NOW = 1_700_000_000.0


def write_json(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document), encoding="utf-8")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def seed_catalog(
    ctx: LaunchContext,
    provider_id: str,
    models: list[CatalogModel],
    fetched_at: float = NOW,
) -> None:
    """Write a cache exactly as ``catalog.refresh`` would for the current settings."""
    provider = all_providers(ctx, load_settings(ctx))[provider_id]
    write_catalog(ctx, provider, models, fetched_at)


@dataclass
class ModelServer:
    """Records requests; ``routes`` maps a path to (status, JSON body)."""

    base: str = ""
    routes: dict[str, tuple[int, Any]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
