"""The daemon's exit codes, which its service units and operator commands also name.

A module of constants alone, so that ``magi-code daemon status`` and ``install`` read them
without loading the daemon itself (``lifecycle`` imports every service it builds).
"""

from __future__ import annotations

from typing import Final

EXIT_UNSAFE: Final = 2
EXIT_ALREADY_RUNNING: Final = 3
# EX_TEMPFAIL: stopped to be replaced (another build's client, ``daemon restart``); a
# service manager starts it again, an on-demand daemon is started by the next client.
EXIT_RESTART: Final = 75
