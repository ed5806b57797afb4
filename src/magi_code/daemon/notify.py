"""The service manager's side channels: ``sd_notify`` datagrams and the journal stream.

A daemon started by a ``Type=notify`` systemd unit finds ``$NOTIFY_SOCKET`` in its
environment: an ``AF_UNIX`` datagram socket (a path, or ``@name`` in Linux's abstract
namespace) that takes newline-separated ``KEY=value`` assignments. The daemon sends
``READY=1`` once its socket answers and ``STOPPING=1`` when it decides to stop. Sending is
best effort, as libsystemd's ``sd_notify``: no variable, an address that is not ours to
use, or a failed send is silently nothing, and nothing here ever raises.

``$JOURNAL_STREAM`` (``<device>:<inode>``) names the stream systemd connected stdout or
stderr to; a process that finds its fd 2 is that stream is logging to the journal.

Only a daemon a service manager started listens to either: an on-demand daemon may have
inherited both from a frontend that a service manager runs, and must not speak for it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from typing import Final

NOTIFY_ENV: Final = "NOTIFY_SOCKET"
JOURNAL_ENV: Final = "JOURNAL_STREAM"
SEND_TIMEOUT_SECONDS: Final = 2.0  # the manager reads its notify socket at once


class Notifier:
    """Datagrams to one notify socket; ``Notifier(None)`` sends nothing."""

    def __init__(self, address: str | None) -> None:
        self.address = _socket_address(address)

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Notifier:
        return cls(env.get(NOTIFY_ENV))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; True when it was sent."""
        if self.address is None or not assignments:
            return False
        payload = "\n".join(line.replace("\n", " ") for line in assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_SECONDS)
                sock.sendto(payload, self.address)
        except (OSError, ValueError):
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"MAINPID={os.getpid()}", f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")


def _socket_address(value: str | None) -> str | None:
    """``/path`` as is, ``@name`` as the abstract ``\\0name``; anything else is unusable."""
    if not value or "\0" in value:
        return None
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None  # relative paths, vsock: addresses and the like: not ours to guess


def stderr_is_journal(env: Mapping[str, str]) -> bool:
    """True when fd 2 is the stream ``$JOURNAL_STREAM`` names (systemd's own test)."""
    device, sep, inode = env.get(JOURNAL_ENV, "").partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    with contextlib.suppress(OSError):
        st = os.fstat(2)
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    return False
