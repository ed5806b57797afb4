"""protocol/ stays sans-IO: importing it loads no event loop, HTTP or daemon code."""

from __future__ import annotations

import subprocess
import sys


def test_protocol_imports_no_io_layer() -> None:
    code = (
        "import sys\n"
        "import magi_code.protocol.envelope, magi_code.protocol.framing\n"
        "import magi_code.protocol.frames, magi_code.protocol.bounds, magi_code.protocol.text\n"
        "import magi_code.protocol.v2\n"
        "bad = [m for m in ('asyncio', 'httpx', 'uvloop', 'magi_code.core', 'magi_code.daemon')"
        " if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""
