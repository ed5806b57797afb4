"""Durations an environment may set (``MC_..._SECONDS``), such as the timeouts tests shorten."""

from __future__ import annotations

import math
from collections.abc import Mapping


def seconds_from(env: Mapping[str, str], name: str, default: float) -> float:
    """``env[name]`` as a positive, finite number of seconds; ``default`` when it is unset
    or not one."""
    try:
        value = float(env.get(name, ""))
    except ValueError:
        return default
    return value if 0 < value < math.inf else default
