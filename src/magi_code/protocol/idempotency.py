"""The form of a ``turn.start`` idempotency key (protocol v2), which sessions record too.

Its own module: the session store checks keys on every turn, and importing ``v2`` for
this one check would load all of the v2 frame definitions into the embedded service.
"""

from __future__ import annotations

import re
from typing import Final, TypeGuard

MAX_IDEMPOTENCY_KEY_CHARS: Final = 64
_KEY_RE: Final = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}")


def valid_idempotency_key(value: object) -> TypeGuard[str]:
    """1 to 64 ASCII letters, digits, ``-``, ``_``, ``.`` or ``:``."""
    return isinstance(value, str) and _KEY_RE.fullmatch(value) is not None
