"""Session titles: a short, sanitized display label derived from the first user prompt.

Hidden characters are dropped, whitespace is collapsed, credential-shaped tokens are
replaced (``protocol.text``), and the result is capped at ``MAX_TITLE_CHARS`` characters.
This is not a guarantee that arbitrary user-written secrets cannot appear in a title.
"""

from __future__ import annotations

from typing import Final

from magi_code.protocol.text import one_line, redact_secrets

MAX_TITLE_CHARS: Final = 80


def sanitize_title(value: object) -> str | None:
    """A display-safe title, or ``None`` when nothing displayable remains."""
    if not isinstance(value, str):
        return None
    collapsed = one_line(redact_secrets(one_line(value[: MAX_TITLE_CHARS * 8])))
    if len(collapsed) > MAX_TITLE_CHARS:
        collapsed = collapsed[: MAX_TITLE_CHARS - 1].rstrip() + "…"
    return collapsed or None


def title_from_prompt(text: str) -> str | None:
    """The sanitized first non-blank line of a user prompt."""
    for line in text[:4096].splitlines():
        if line.strip():
            return sanitize_title(line)
    return None
