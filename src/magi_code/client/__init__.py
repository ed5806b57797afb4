"""Public async client for the magi-code daemon (protocol v2, RFC-0002).

``Client.connect(ctx)`` connects (starting the daemon on demand), checks the daemon's UID,
says hello with the launch context, and then carries v1 requests and events; see
``docs/unix-daemon.md`` for an example.
"""

from magi_code.client.connection import (
    Channel,
    Client,
    DaemonError,
    DaemonUnavailable,
    DeadlineExceeded,
    connect_channel,
    socket_for,
)

__all__ = [
    "Channel",
    "Client",
    "DaemonError",
    "DaemonUnavailable",
    "DeadlineExceeded",
    "connect_channel",
    "socket_for",
]
