"""Session titles: a short, sanitized display label derived from the first user prompt.

There is no shared redaction module yet, so this applies a small local policy: control
and format characters are dropped, whitespace is collapsed, obvious credential-shaped
tokens are replaced, and the result is capped at ``MAX_TITLE_CHARS`` characters. This is
not a guarantee that arbitrary user-written secrets cannot appear in a title.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

MAX_TITLE_CHARS: Final = 80
REDACTED: Final = "[redacted]"

_SECRET_RE: Final = re.compile(
    r"(?:sk-|ghp_|gho_|github_pat_|xox[abprs]-|AKIA|eyJ)[A-Za-z0-9_.\-]{8,}"
    r"|\b[A-Za-z0-9+/_=\-]{32,}"
    r"|(?i:bearer\s+)\S+",
)


def sanitize_title(value: object) -> str | None:
    """A display-safe title, or ``None`` when nothing displayable remains."""
    if not isinstance(value, str):
        return None
    kept = "".join(
        " " if ch.isspace() else ch
        for ch in value[: MAX_TITLE_CHARS * 8]
        if ch.isspace() or unicodedata.category(ch) not in {"Cc", "Cf", "Cs", "Co", "Cn"}
    )
    collapsed = " ".join(_SECRET_RE.sub(REDACTED, kept).split())
    if len(collapsed) > MAX_TITLE_CHARS:
        collapsed = collapsed[: MAX_TITLE_CHARS - 1].rstrip() + "…"
    return collapsed or None


def title_from_prompt(text: str) -> str | None:
    """The sanitized first non-blank line of a user prompt."""
    for line in text[:4096].splitlines():
        if line.strip():
            return sanitize_title(line)
    return None
