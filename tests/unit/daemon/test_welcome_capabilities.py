"""The v2 ``welcome`` capabilities RFC-0002 documents are the ones the daemon sends, in
the same order."""

import re
from pathlib import Path

from magi_code.daemon.server import CAPABILITIES

RFC = Path(__file__).resolve().parents[3] / "docs" / "rfc" / "0002-persistent-service-protocol.md"


def test_the_rfc_welcome_lists_the_daemon_capabilities() -> None:
    welcome = re.search(r'\{"t": "welcome".*?"capabilities": \[(.*?)\]\}', RFC.read_text(), re.S)
    assert welcome is not None
    assert re.findall(r'"([^"]+)"', welcome.group(1)) == list(CAPABILITIES)
