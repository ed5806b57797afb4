"""Public client for the magi-code daemon (protocol v2, RFC-0002); see ``docs/client.md``.

``Client.connect(ctx)`` connects (starting the daemon on demand), checks the daemon's UID,
says hello with the launch context, and then carries v1 requests and events, snapshots,
attachments and control grants. ``SyncClient`` is the same for code without an event
loop. Everything a frontend needs is importable from here.
"""

from magi_code.client.channel import Channel, socket_for
from magi_code.client.connection import (
    MAX_QUEUED_EVENTS,
    Client,
    connect_channel,
    new_idempotency_key,
)
from magi_code.client.errors import (
    DaemonDraining,
    DaemonError,
    DaemonTimeout,
    DaemonUnavailable,
    DeadlineExceeded,
    ForeignDaemon,
    OutcomeUnknown,
)
from magi_code.client.starter import DaemonStartError
from magi_code.client.sync import SyncClient
from magi_code.client.types import (
    AttachResult,
    AttachStatus,
    ControlGranted,
    ControlStatus,
    ErrorInfo,
    Event,
    EventEnvelope,
    GrantedTurn,
    Overloaded,
    ResponseEnvelope,
    SnapshotItem,
    SnapshotPage,
)
from magi_code.protocol.v2 import Role
from magi_code.storage.launch import LaunchContext

__all__ = [
    "MAX_QUEUED_EVENTS",
    "AttachResult",
    "AttachStatus",
    "Channel",
    "Client",
    "ControlGranted",
    "ControlStatus",
    "DaemonDraining",
    "DaemonError",
    "DaemonStartError",
    "DaemonTimeout",
    "DaemonUnavailable",
    "DeadlineExceeded",
    "ErrorInfo",
    "Event",
    "EventEnvelope",
    "ForeignDaemon",
    "GrantedTurn",
    "LaunchContext",
    "OutcomeUnknown",
    "Overloaded",
    "ResponseEnvelope",
    "Role",
    "SnapshotItem",
    "SnapshotPage",
    "SyncClient",
    "connect_channel",
    "new_idempotency_key",
    "socket_for",
]
