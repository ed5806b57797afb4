"""magi-code application service."""

import sys

# httpx's ``__init__`` imports its command-line client, ``httpx._main``, which imports
# click and pygments whenever they happen to be installed (~13 ms of every start that
# loads httpx), and falls back to a stub ``httpx.main`` when that import fails. The
# product never runs httpx's CLI (tests/unit/test_startup_imports.py checks that no
# module uses it), so the module is marked as not importable, before anything imports
# httpx, and the fallback is taken. ``setdefault``: a process that already imported
# httpx keeps its CLI.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
