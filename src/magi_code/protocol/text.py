"""Display-text helpers shared by every projection: UTF-8 bounds and sanitizing.

Sanitizing is best effort (control characters removed, credential-shaped tokens
replaced); it is not a guarantee that arbitrary user-written secrets cannot appear.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

REDACTED: Final = "[redacted]"
# Control, format, surrogate, private-use and unassigned characters never display.
_HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_SECRET_RE: Final = re.compile(
    r"(?i:bearer\s+)\S+"
    r"|\b(?:sk|pk|rk|ak)[-_][A-Za-z0-9_-]{12,}"
    r"|(?:ghp_|gho_|github_pat_|xox[abprs]-|AKIA|eyJ)[A-Za-z0-9_.\-]{8,}"
    r"|(?i:\b[a-z][a-z0-9+.-]*://[^\s/@]+:[^\s/@]+@\S+)"
    r"|\b[A-Za-z0-9+/_=\-]{32,}"
    r"|(?:/home|/Users|/root)/[^\s\"'`]+"
)


def utf8_parts(text: str, limit: int) -> list[str]:
    """``text`` in parts of at most ``limit`` UTF-8 bytes, never splitting a character."""
    if len(text) <= limit // 4:
        return [text]
    data = text.encode("utf-8")
    parts: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:
            end -= 1  # back off continuation bytes to the character start
        parts.append(data[start:end].decode("utf-8"))
        start = end
    return parts or [""]


def truncate_utf8(text: str, limit: int) -> tuple[str, bool]:
    """At most ``limit`` UTF-8 bytes without splitting a character; and whether it cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def without_hidden(text: str, keep: str = "") -> str:
    """Drop characters that do not display (except those in ``keep``)."""
    return "".join(
        ch for ch in text if ch in keep or unicodedata.category(ch) not in _HIDDEN_CATEGORIES
    )


def one_line(text: str) -> str:
    """Visible characters with every run of whitespace collapsed to one space."""
    return " ".join(without_hidden(text, keep=" \t\n\r").split())


def redact_secrets(text: str) -> str:
    return _SECRET_RE.sub(REDACTED, text)
