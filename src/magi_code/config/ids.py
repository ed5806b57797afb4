"""Selection IDs, display labels and reasoning levels: the filters every projection uses.

Provider/model IDs cross the wire as selection values, so they are restricted to a safe
ASCII alphabet and anything that looks like a credential is treated as unsafe (spec,
"Provider and model catalogs"). Labels are display text only: control and format
characters are dropped and the UTF-8 size is bounded without splitting a character.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, TypeGuard

from magi_code.protocol.text import one_line, truncate_utf8

MAX_SELECTION_ID_BYTES: Final = 256
MAX_LABEL_BYTES: Final = 128

# Wire order of reasoning choices; every list we emit follows it.
THINKING_LEVELS: Final = ("default", "low", "medium", "high", "x_high", "max")

ID_PATTERN: Final = r"^[A-Za-z0-9._/:-]{1,256}$"
_ID_RE: Final = re.compile(ID_PATTERN)

# Well-known credential shapes (API keys, OAuth/JWT tokens, cloud keys).
_SECRET_PREFIXES: Final = (
    "sk-",
    "sk_",
    "rk_",
    "pk_",
    "ghp_",
    "gho_",
    "ghs_",
    "ghu_",
    "github_pat_",
    "glpat-",
    "xox",
    "hf_",
    "akia",
    "aiza",
    "eyj",
    "bearer",
)
_SEGMENT_RE: Final = re.compile(r"[-./:]")
# A long unbroken run of mixed letters and digits reads as a token, not a model name.
_TOKEN_MIN_LEN: Final = 24


def looks_secret(value: str) -> bool:
    lowered = value.lower()
    if lowered.startswith(_SECRET_PREFIXES):
        return True
    for segment in _SEGMENT_RE.split(value):
        if (
            len(segment) >= _TOKEN_MIN_LEN
            and any(c.isdigit() for c in segment)
            and any(c.isalpha() for c in segment)
        ):
            return True
    return False


def is_safe_id(value: object) -> TypeGuard[str]:
    """True for a nonempty, bounded, allowlisted ID that does not look like a secret."""
    return isinstance(value, str) and bool(_ID_RE.fullmatch(value)) and not looks_secret(value)


def sanitize_label(label: object, fallback_id: str) -> str:
    """A bounded display label; falls back to the (bounded) ID when nothing usable remains."""
    if isinstance(label, str):
        text = truncate_utf8(one_line(label), MAX_LABEL_BYTES)[0].strip()
        if text and not looks_secret(text):
            return text
    return truncate_utf8(fallback_id, MAX_LABEL_BYTES)[0]


def normalize_levels(levels: Iterable[object]) -> list[str]:
    """Known levels only, in wire order, always including ``default`` (at most six)."""
    wanted = {level for level in levels if isinstance(level, str)}
    wanted.add("default")
    return [level for level in THINKING_LEVELS if level in wanted]
