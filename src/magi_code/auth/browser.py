"""Opening a login's authorization URL in the user's browser (frontends only: the core
never opens one; ``magi-code login`` and the ACP adapter do, on the user's machine)."""

from __future__ import annotations

import webbrowser


def open_browser(url: str) -> bool:
    """Open ``url`` in the user's browser (``BROWSER`` chooses it); whether one opened."""
    try:
        return webbrowser.open(url, new=1)
    except (webbrowser.Error, OSError):
        return False
