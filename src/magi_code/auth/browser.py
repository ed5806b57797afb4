"""Opening a login's authorization URL in the user's browser (frontends only: the core
never opens one; ``magi-code login`` and the ACP adapter do, on the user's machine)."""

from __future__ import annotations

import asyncio
import os
import sys
import webbrowser
from typing import Final

# A failure bound: a launcher normally returns at once (the browser runs on).
OPEN_TIMEOUT_S: Final = 60.0


def open_browser(url: str) -> bool:
    """Open ``url`` in the user's browser (``BROWSER`` chooses it); whether one opened."""
    try:
        return webbrowser.open(url, new=1)
    except (webbrowser.Error, OSError):
        return False


async def open_browser_apart(url: str) -> bool:
    """:func:`open_browser` in a child process with none of our standard streams, for a
    frontend whose stdout is a protocol channel. Without ``TERM`` no console browser is
    tried: it would need a terminal the frontend does not have."""
    env = {k: v for k, v in os.environ.items() if k != "TERM"}
    devnull = asyncio.subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        url,
        stdin=devnull,
        stdout=devnull,
        stderr=devnull,
        env=env,
    )
    try:
        async with asyncio.timeout(OPEN_TIMEOUT_S):
            return await proc.wait() == 0
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return False


if __name__ == "__main__":
    sys.exit(0 if open_browser(sys.argv[1]) else 1)
