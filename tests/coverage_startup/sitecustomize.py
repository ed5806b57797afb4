"""Measure this Python process with coverage.py (``make coverage``, docs/development.md).

``make coverage`` puts this directory on ``PYTHONPATH``, so every Python process of the
run imports this module at start-up: pytest and its workers, the shims and embedded
services they spawn, and the daemon, whose allow-list keeps ``PYTHONPATH`` but drops the
``COVERAGE_*`` variables coverage.py's own subprocess support relies on. Each process
writes its own data file beside the repository's ``pyproject.toml`` (``[tool.coverage]``);
``coverage combine`` joins them. A process that cannot write there (a sandboxed command)
or has no coverage.py (another interpreter) runs unmeasured.
"""

import os
from pathlib import Path

_root = Path(__file__).resolve().parents[2]
if os.access(_root, os.W_OK):
    try:
        import coverage
    except ImportError:
        coverage = None
    if coverage is not None:
        os.environ["COVERAGE_PROCESS_START"] = str(_root / "pyproject.toml")
        os.environ["COVERAGE_FILE"] = str(_root / ".coverage")
        coverage.process_startup()
