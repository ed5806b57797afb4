"""When a request's deadline (protocol v2 ``deadline_ms``) has passed.

Its own module: turn admission checks it again after its settings capture, and importing
``v2`` for this one check would load all of the v2 frame definitions into the embedded
service.
"""

from __future__ import annotations

import time


def deadline_passed(deadline_ms: int | None) -> bool:
    """Whether ``deadline_ms`` (Unix time in milliseconds; None: never) has passed."""
    return deadline_ms is not None and time.time() * 1000 >= deadline_ms
