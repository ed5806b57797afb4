"""Public client for the magi-code daemon (protocol v2, RFC-0002); see ``docs/client.md``.

``Client.connect(ctx)`` connects (starting the daemon on demand), checks the daemon's UID,
says hello with the launch context, and then carries v1 requests and events, snapshots,
attachments, control grants and approvals. ``SyncClient`` is the same for code without an event
loop. ``V1StreamValidator`` checks a v1 stdio stream as a consumer must (``client.v1stream``).
Everything a frontend needs is importable from here.

Names are imported on first use, so a light submodule (``client.errors``,
``client.handshake``: what the stdio shim needs) can be imported without asyncio or the
HTTP stack behind the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magi_code.client.channel import Channel, socket_for
    from magi_code.client.connection import (
        MAX_QUEUED_EVENTS,
        Client,
        connect_channel,
        new_idempotency_key,
    )
    from magi_code.client.errors import (
        ApprovalError,
        ControlError,
        ControlRefused,
        DaemonDraining,
        DaemonError,
        DaemonTimeout,
        DaemonUnavailable,
        DeadlineExceeded,
        ForeignDaemon,
        GrantsError,
        OutcomeUnknown,
        QueueError,
        SessionError,
        SteerError,
        WatchError,
    )
    from magi_code.client.starter import DaemonStartError
    from magi_code.client.sync import SyncClient
    from magi_code.client.types import (
        ApprovalRequest,
        ApprovalResolved,
        AttachResult,
        AttachStatus,
        ControlChanged,
        ControlGranted,
        ControlRequested,
        ControlStatus,
        ErrorInfo,
        Event,
        EventEnvelope,
        FileRequest,
        GrantedTurn,
        GrantRules,
        Grants,
        Overloaded,
        QueueChanged,
        QueueEntry,
        ResponseEnvelope,
        RewindResult,
        Rewound,
        SessionInfo,
        SessionsPage,
        SnapshotItem,
        SnapshotPage,
        TitleChanged,
        ToolDetail,
        TranscriptPage,
        TurnStarted,
        Watched,
        WatchedApproval,
        WatchedEvent,
        WatchOverloaded,
        WatchResult,
    )
    from magi_code.client.v1stream import StreamViolation, V1StreamValidator
    from magi_code.protocol.v2 import Role
    from magi_code.storage.launch import LaunchContext

# Each public name and the module that defines it.
_HOMES = {
    "Channel": "magi_code.client.channel",
    "socket_for": "magi_code.client.channel",
    "MAX_QUEUED_EVENTS": "magi_code.client.connection",
    "Client": "magi_code.client.connection",
    "connect_channel": "magi_code.client.connection",
    "new_idempotency_key": "magi_code.client.connection",
    "ApprovalError": "magi_code.client.errors",
    "DaemonDraining": "magi_code.client.errors",
    "DaemonError": "magi_code.client.errors",
    "DaemonTimeout": "magi_code.client.errors",
    "DaemonUnavailable": "magi_code.client.errors",
    "DeadlineExceeded": "magi_code.client.errors",
    "ForeignDaemon": "magi_code.client.errors",
    "GrantsError": "magi_code.client.errors",
    "SteerError": "magi_code.client.errors",
    "SessionError": "magi_code.client.errors",
    "OutcomeUnknown": "magi_code.client.errors",
    "DaemonStartError": "magi_code.client.starter",
    "SyncClient": "magi_code.client.sync",
    "ApprovalRequest": "magi_code.client.types",
    "ApprovalResolved": "magi_code.client.types",
    "AttachResult": "magi_code.client.types",
    "AttachStatus": "magi_code.client.types",
    "ControlGranted": "magi_code.client.types",
    "ControlStatus": "magi_code.client.types",
    "ErrorInfo": "magi_code.client.types",
    "Event": "magi_code.client.types",
    "EventEnvelope": "magi_code.client.types",
    "FileRequest": "magi_code.client.types",
    "GrantedTurn": "magi_code.client.types",
    "GrantRules": "magi_code.client.types",
    "Grants": "magi_code.client.types",
    "Rewound": "magi_code.client.types",
    "RewindResult": "magi_code.client.types",
    "SessionInfo": "magi_code.client.types",
    "SessionsPage": "magi_code.client.types",
    "Overloaded": "magi_code.client.types",
    "ResponseEnvelope": "magi_code.client.types",
    "SnapshotItem": "magi_code.client.types",
    "SnapshotPage": "magi_code.client.types",
    "TranscriptPage": "magi_code.client.types",
    "ToolDetail": "magi_code.client.types",
    "StreamViolation": "magi_code.client.v1stream",
    "V1StreamValidator": "magi_code.client.v1stream",
    "Role": "magi_code.protocol.v2",
    "LaunchContext": "magi_code.storage.launch",
    "ControlError": "magi_code.client.errors",
    "ControlRefused": "magi_code.client.errors",
    "WatchError": "magi_code.client.errors",
    "ControlChanged": "magi_code.client.types",
    "ControlRequested": "magi_code.client.types",
    "TurnStarted": "magi_code.client.types",
    "WatchOverloaded": "magi_code.client.types",
    "WatchResult": "magi_code.client.types",
    "Watched": "magi_code.client.types",
    "WatchedApproval": "magi_code.client.types",
    "WatchedEvent": "magi_code.client.types",
    "QueueError": "magi_code.client.errors",
    "QueueChanged": "magi_code.client.types",
    "QueueEntry": "magi_code.client.types",
    "TitleChanged": "magi_code.client.types",
}

__all__ = [
    "MAX_QUEUED_EVENTS",
    "ApprovalError",
    "ApprovalRequest",
    "ApprovalResolved",
    "AttachResult",
    "AttachStatus",
    "Channel",
    "Client",
    "ControlChanged",
    "ControlError",
    "ControlGranted",
    "ControlRefused",
    "ControlRequested",
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
    "FileRequest",
    "ForeignDaemon",
    "GrantRules",
    "GrantedTurn",
    "Grants",
    "GrantsError",
    "LaunchContext",
    "OutcomeUnknown",
    "Overloaded",
    "QueueChanged",
    "QueueEntry",
    "QueueError",
    "ResponseEnvelope",
    "RewindResult",
    "Rewound",
    "Role",
    "SessionError",
    "SessionInfo",
    "SessionsPage",
    "SnapshotItem",
    "SnapshotPage",
    "SteerError",
    "StreamViolation",
    "SyncClient",
    "TitleChanged",
    "ToolDetail",
    "TranscriptPage",
    "TurnStarted",
    "V1StreamValidator",
    "WatchError",
    "WatchOverloaded",
    "WatchResult",
    "Watched",
    "WatchedApproval",
    "WatchedEvent",
    "connect_channel",
    "new_idempotency_key",
    "socket_for",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
