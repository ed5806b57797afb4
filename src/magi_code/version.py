"""The installed package version (``server_version``, the daemon's ``version``)."""

from __future__ import annotations

import functools


@functools.cache
def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("magi-code")
    except PackageNotFoundError:
        return "0.0.0"
