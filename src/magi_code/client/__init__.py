"""Public async client for the magi-code daemon (protocol v2, RFC-0002).

``Client.connect(ctx)`` connects (starting the daemon on demand), checks the daemon's UID,
says hello with the launch context, and then carries v1 requests and events; see
``docs/unix-daemon.md`` for an example.
"""

from magi_code.client.channel import Channel, socket_for
from magi_code.client.connection import Client, connect_channel
from magi_code.client.errors import DaemonError, DaemonUnavailable, DeadlineExceeded
from magi_code.client.starter import DaemonStartError

__all__ = [
    "Channel",
    "Client",
    "DaemonError",
    "DaemonStartError",
    "DaemonUnavailable",
    "DeadlineExceeded",
    "connect_channel",
    "socket_for",
]
