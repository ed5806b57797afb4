"""An interpreter that a command in the tools' sandbox can run.

The sandbox gives commands a private, empty ``/tmp``, and the test's virtualenv may live
under ``/tmp`` (a CI clone there): its interpreter and packages are then invisible inside.
Sandboxed test commands run the base installation's interpreter instead (read-only but
visible), with copies of the packages they import placed in the project directory.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import msgpack
import orjson

import magi_code

_BASE = Path(sys.base_prefix) / "bin" / "python3"
PYTHON = os.path.realpath(_BASE if _BASE.exists() else sys.executable)


def importable_in(project: Path) -> str:
    """Copy ``magi_code``, ``msgpack`` and ``orjson`` under ``project``; the PYTHONPATH."""
    lib = project / ".pylib"
    for package in (magi_code, msgpack, orjson):
        source = Path(package.__file__ or "").parent
        shutil.copytree(
            source,
            lib / source.name,
            ignore=shutil.ignore_patterns("__pycache__"),
            dirs_exist_ok=True,
        )
    return str(lib)
