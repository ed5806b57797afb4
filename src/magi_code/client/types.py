"""Typed values the client returns: v1 envelopes and the answers of v2 frames.

The v1 envelopes are the daemon's maps as they arrive (``TypedDict``s: index them like
dicts); :class:`Overloaded`, :class:`ToolDetail` and :class:`FileRequest` are the notices the
client turns into values of its own.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from magi_code.dataclass import dataclass


class ErrorInfo(TypedDict):
    """The ``error`` member of a failed v1 response."""

    code: str
    message: str


class ResponseEnvelope(TypedDict):
    """A v1 response: exactly one of ``payload`` and ``error`` is not None."""

    protocol_version: int
    kind: Literal["response"]
    request_id: str | None
    session_id: str | None
    method: str | None
    payload: dict[str, Any] | None
    error: ErrorInfo | None


class EventEnvelope(TypedDict):
    """A v1 event (``turn.started``, ``turn.assistant_delta``, ``turn.terminal``, ...)."""

    protocol_version: int
    kind: Literal["event"]
    event_id: str
    request_id: str | None
    session_id: str | None
    event: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Overloaded:
    """The daemon cut this connection from a turn's live stream (RFC-0002 §6.2).

    Nothing more of ``turn_id`` arrives (not even its terminal) until you call
    ``attach(turn_id, after_sequence)``; ``after_sequence`` is the last sequence of that
    turn this connection was sent (-1 if none).
    """

    turn_id: str
    after_sequence: int


@dataclass(frozen=True, slots=True)
class ToolDetail:
    """A detail of a tool call of a turn this client started (RFC-0002 §6.8; only with
    ``tool_details=True``): ``detail`` is ``{"call": {...}}`` or ``{"diff": {...}}`` of the
    call whose activity ID is ``activity_id``."""

    turn_id: str
    session_id: str
    activity_id: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FileRequest:
    """The daemon asks this client's editor to read or write a project file for a turn's
    tool (RFC-0002 §6.8; only with ``editor_files``). Answer with
    :meth:`magi_code.client.Client.answer_file`. ``path`` is project-relative; ``content``
    is the new text of a ``write``."""

    fs_id: str
    turn_id: str
    session_id: str
    op: Literal["read", "write"]
    path: str
    content: str | None


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A tool call of a turn this connection is attached to waits for an answer
    (RFC-0002 §6.7; only on a client that asked for approvals).

    Answer it with ``answer_approval(approval_id, decision)``, ``decision`` one of
    ``options``. ``summary`` is ``{"argv", "command", "truncated"}`` (kind ``command``),
    ``{"path", "diff", "truncated"}`` (``file_change``) or ``{"server", "tool"}``
    (``mcp_tool``). The same request may arrive again (after an attach or a control
    grant): key it by ``approval_id``.
    """

    approval_id: str
    turn_id: str
    session_id: str
    kind: str
    summary: dict[str, Any]
    options: tuple[str, ...]
    deadline_ms: int
    # The ``activity_id`` of the tool call's ``turn.activity`` items (None if unknown).
    activity_id: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    """A request was settled: ``decision`` is an answer, ``timed_out`` or ``cancelled``;
    ``by`` the answering connection's ``<client_name>#<n>``, ``deadline`` or
    ``turn_ended``."""

    approval_id: str
    decision: str
    by: str


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """A turn started on a watched session (RFC-0002 §6.9): ``by`` is the starting
    connection's ``<client_name>#<n>``. Its events follow as :class:`Watched` envelopes,
    from ``turn.started`` (``complete`` is False when its earliest ones were evicted)."""

    session_id: str
    turn_id: str
    by: str
    prompt: str
    complete: bool = True


@dataclass(frozen=True, slots=True)
class ControlChanged:
    """The session's controller changed: ``controller`` is the new one's label, None when
    it was released. Sent to a controller that lost the session to a request, and (inside
    :class:`Watched`) to the session's watchers."""

    session_id: str
    controller: str | None


@dataclass(frozen=True, slots=True)
class ControlRequested:
    """``by`` asks for a session. Received directly, this client controls it: answer with
    ``answer_control(session_id, grant)`` within ``timeout_ms``, or it is granted once no
    turn runs. Inside :class:`Watched` it is for information only."""

    session_id: str
    by: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Rewound:
    """The session was rewound to ``to_cursor`` (RFC-0002 §6.16): the history after it
    left the conversation. Watch again from ``to_cursor`` (or the start)."""

    session_id: str
    to_cursor: str


@dataclass(frozen=True, slots=True)
class WatchedApproval:
    """An approval request of a watched session's turn was asked (``request``) or
    settled (``resolved``; ``turn_id`` names its turn). Read-only: answer only the
    :class:`ApprovalRequest` a client gets because it is attached to the turn."""

    session_id: str
    turn_id: str
    request: ApprovalRequest | None = None
    resolved: ApprovalResolved | None = None


class QueueEntry(TypedDict):
    """A queued prompt (RFC-0002 §6.12): it runs as a turn of its session when its turn
    comes; ``by`` is the label of the connection that queued it."""

    entry_id: str
    text: str
    by: str
    added_at: str  # RFC 3339, UTC


@dataclass(frozen=True, slots=True)
class QueueChanged:
    """A watched session's prompt queue changed: ``entries`` is the whole queue now, in
    the order it runs (an entry leaves it when its turn starts)."""

    session_id: str
    entries: tuple[QueueEntry, ...]


@dataclass(frozen=True, slots=True)
class TitleChanged:
    """A watched session was renamed: ``title`` is its title now (sanitized)."""

    session_id: str
    title: str | None


WatchedEvent = (
    EventEnvelope
    | TurnStarted
    | ControlChanged
    | ControlRequested
    | WatchedApproval
    | QueueChanged
    | TitleChanged
    | Rewound
)


@dataclass(frozen=True, slots=True)
class Watched:
    """Something that happened on a session this client watches (RFC-0002 §6.9): a turn
    event (a v1 event envelope, ``turn.started`` to ``turn.terminal``) or a session
    event. It only informs: a client that also started or follows the turn gets its own
    copy of the turn's events besides."""

    session_id: str
    event: WatchedEvent


@dataclass(frozen=True, slots=True)
class WatchOverloaded:
    """The daemon ended the watch of ``session_id`` (its frames met a full outbound
    queue): nothing more of it arrives. Watch again from the last history cursor."""

    session_id: str


class WatchResult(TypedDict):
    """The answer to ``watch``: the session's history after the cursor (``session.replay``
    items with their ``cursor``s, every part joined), up to the first turn delivered live
    through ``events()`` as :class:`Watched`."""

    session_id: str
    items: list[dict[str, Any]]
    before_cursor: str  # the cursor just before the first item
    gap: bool


Event = (
    EventEnvelope
    | Overloaded
    | ToolDetail
    | FileRequest
    | ApprovalRequest
    | ApprovalResolved
    | Watched
    | WatchOverloaded
    | ControlChanged
    | ControlRequested
)
"""What :meth:`magi_code.client.Client.events` yields (the details, file requests and
approval notices only on a client that asked for them; :class:`Watched` and
:class:`WatchOverloaded` only while it watches; :class:`ControlRequested` and
:class:`ControlChanged` only while it controls a session another client asks for)."""


class GrantRules(TypedDict):
    commands: list[list[str]]  # argv prefixes
    tools: list[str]
    paths: list[str]


class Grants(TypedDict):
    """The answer to ``grants_list`` and ``grants_revoke`` (RFC-0002 §6.7)."""

    session: GrantRules | None  # the session's grants; None when no session was named
    project: GrantRules  # the project settings' allow rules
    project_honoured: bool  # the project is trusted, so its allow rules count


class SessionInfo(TypedDict):
    """One session of the library (RFC-0002 §6.11)."""

    session_id: str
    title: str | None  # the explicit title (rename), else the first prompt's
    updated_at: str  # last activity (RFC 3339, UTC)
    project_dir: str | None  # where it was created; None for sessions older than that
    archived: bool
    # Fork links (RFC-0002 §6.16), only on sessions that have them.
    forked_from: NotRequired[dict[str, str]]  # {"session_id", "at_cursor"}
    forks: NotRequired[list[str]]  # the latest 64 forks' IDs


class RewindFile(TypedDict):
    path: str  # relative to the project root of the turn that changed it
    # A preview: "restore", "unchanged", "conflict" (changed outside the agent since),
    # "not_restorable" (its checkpoint is gone). A commit: "restored", "unchanged",
    # "conflict" (left alone), "not_restorable", "failed", or "kept" (files: false).
    state: str


class RewindResult(TypedDict):
    """A ``session.rewind`` answer (RFC-0002 §6.16): its preview, or what it did."""

    session_id: str
    committed: bool
    messages: list[dict[str, Any]]  # replay items that leave the conversation (excerpts)
    message_count: int
    files: list[RewindFile]  # at most 128; ``file_count`` and ``file_states`` cover all
    file_count: int
    file_states: dict[str, int]


class SessionsPage(TypedDict):
    sessions: list[SessionInfo]  # most recent activity first
    next_cursor: str | None  # None on the last page
    incomplete: bool  # some sessions could not be examined or read


class TranscriptPage(TypedDict):
    # session.replay item bodies (no cursor) and {"kind": "tool_call", ...} items, in order
    items: list[dict[str, Any]]
    next_cursor: str | None  # None on the last page
    gap: bool  # some history could not be read or lies before the window


class SnapshotItem(TypedDict):
    """One turn the daemon knows: running, or finished within retention."""

    turn_id: str
    session_id: str | None
    project_dir: str | None
    request_id: str | None
    idempotency_key: str | None
    status: str  # "running" or the terminal status
    assistant_text: str  # accepted so far, or the terminal's
    sequence: int  # the last sequence emitted
    terminal: dict[str, Any] | None  # the terminal payload without assistant_text
    failure: str | None  # a failed turn's label (docs/turns.md), else None


class SnapshotPage(TypedDict):
    turns: list[SnapshotItem]
    next_cursor: str | None


AttachStatus = Literal["attached", "resync", "finished"]


class AttachResult(TypedDict):
    """The answer to ``attach``, with every part's events joined in order.

    ``attached``: later events of the turn arrive through ``events()``. ``resync``: some
    events after the requested sequence were evicted (use ``snapshot`` and
    ``session.replay``); later ones still arrive. ``finished``: ``events`` ends with the
    turn's ``turn.terminal``.
    """

    turn_id: str
    status: AttachStatus
    events: list[EventEnvelope]
    failure: str | None  # a failed turn's label (its terminal's failure), else None


class GrantedTurn(TypedDict):
    turn_id: str
    sequence: int  # the last sequence recorded for the turn


class ControlGranted(TypedDict):
    """The answer to ``take_control``: the session and its running turns."""

    session_id: str
    turns: list[GrantedTurn]


class ControlStatus(TypedDict, total=False):
    """The ``control("status")`` result (RFC-0002 §4)."""

    running: bool
    pid: int
    version: str
    build_id: str
    upgrade_pending: bool
    restart_pending: bool
    instance_id: str
    protocol_versions: list[int]
    socket: str
    mc_home: str
    accepting: bool
    started_at: float
    clients: int
    active_turns: int
    detached_turns: int
    max_active_turns_per_client: int
    max_active_turns: int
    idle_stop_seconds: float | None
    mode: str
    uptime_seconds: int
    retained_turns: int
    retained_turn_bytes: int
    sessions_held: int
    rss_bytes: int
    open_fds: int
    threads: int
    children: dict[str, int]
    zombies: int
    connections: dict[str, int]
    max_outbound_queued_bytes: int
