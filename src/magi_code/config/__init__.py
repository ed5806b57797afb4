"""Settings, model catalogs and the effective configuration (domain layer).

Routes map onto this package as follows (the coordinator checks each payload against
its declared shape first, and runs the sync calls in its configuration worker thread):

- ``config.get``: ``effective_config(ctx, load_settings(ctx))``
- ``config.set``: ``apply_config_set(ctx, payload)``
- ``catalog.providers``: ``provider_page``
- ``catalog.models``: ``model_page``
- ``catalog.refresh``: ``resolve_provider`` (for credentials) + ``await refresh(...)``
"""

from magi_code.config.catalog import (
    CATALOG_TTL_SECONDS,
    CatalogModel,
    CatalogSnapshot,
    CatalogState,
    ModelInfo,
    lookup_model,
    model_page,
    provider_page,
    read_catalog,
    refresh,
    resolve_provider,
)
from magi_code.config.effective import (
    Effective,
    apply_config_set,
    effective_config,
    resolve_effective,
)
from magi_code.config.schema import write_settings_schema
from magi_code.config.settings import (
    McpServerDefinition,
    ProviderDefinition,
    Scope,
    Settings,
    all_providers,
    builtin_providers,
    load_settings,
)

__all__ = [
    "CATALOG_TTL_SECONDS",
    "CatalogModel",
    "CatalogSnapshot",
    "CatalogState",
    "Effective",
    "McpServerDefinition",
    "ModelInfo",
    "ProviderDefinition",
    "Scope",
    "Settings",
    "all_providers",
    "apply_config_set",
    "builtin_providers",
    "effective_config",
    "load_settings",
    "lookup_model",
    "model_page",
    "provider_page",
    "read_catalog",
    "refresh",
    "resolve_effective",
    "resolve_provider",
    "write_settings_schema",
]
