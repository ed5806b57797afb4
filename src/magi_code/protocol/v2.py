"""Protocol v2 (RFC-0002) as typed values: the one place frames are decoded and validated.

Sans-IO: :mod:`magi_code.protocol.frames` turns bytes into bounded msgpack maps; this
module turns a map a client sent into a typed frame (or a :class:`Fatal` / :class:`Rejected`
answer), builds every frame the daemon sends (and the frames a shim or client sends), and
reads the daemon's frames back for clients (the frame type, and typed values for the
frames the handshake, the shim and a persistent client act on). Other modules call these
builders; none spells a frame's ``t``. Codes and their fixed messages are :class:`Code`;
messages never carry request data, paths or secrets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, Literal, TypeGuard, cast

from magi_code.protocol.framing import fits_record
from magi_code.protocol.idempotency import valid_idempotency_key
from magi_code.protocol.limits import MAX_SESSION_PAGE_ITEMS, MAX_STRING_BYTES

PROTOCOL_VERSION: Final = 2
SUPPORTED_VERSIONS: Final = (2,)
MAX_HELLO_VERSIONS: Final = 8
MAX_ENV_ENTRIES: Final = 4096
MAX_CLIENT_NAME: Final = 64
MAX_DELTA_INTERVAL_MS: Final = 10_000
MAX_FILTER_TURN_IDS: Final = 256
MAX_CURSOR_BYTES: Final = 128
MAX_PATH_BYTES: Final = 4096
# A ``sessions_list`` title filter and a ``session_rename`` title, in characters (a
# title itself is cut to 80 when stored).
MAX_TITLE_FILTER: Final = 1024
MAX_BUILD_ID_CHARS: Final = 128
MAX_CLIENT_VERSION_CHARS: Final = 64
# A ``queue_move`` index (a queue holds far fewer entries: past its tail is its tail).
MAX_QUEUE_INDEX: Final = 1024
# ``mcp_servers`` of a ``request`` frame (§6.13): a session's own MCP servers, bounded.
MAX_SESSION_MCP_SERVERS: Final = 16
MAX_SESSION_MCP_BYTES: Final = 64 * 1024
MCP_SERVER_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
# ``session_selection`` (§6.15): a provider or model ID, in characters, and the reasoning
# levels (v1 ``thinking_level``).
MAX_SELECTION_ID_CHARS: Final = 256
THINKING_LEVELS: Final = ("default", "low", "medium", "high", "x_high", "max")
# A ``transcript_result`` page's items, encoded, at most (one frame holds 1 MiB), and its
# cursor (the index of the page's first item).
MAX_TRANSCRIPT_PAGE_BYTES: Final = 512 * 1024
# A transcript's ``tool_call`` item: how the call ended (``no_result``: its turn ended first).
TRANSCRIPT_CALL_STATUSES: Final = frozenset({"completed", "failed", "no_result"})
_TRANSCRIPT_CURSOR: Final = re.compile(r"[0-9]{1,9}")

Role = Literal["v1_shim", "persistent", "control"]
ROLES: Final[dict[str, str]] = {
    "v1_shim": "connection",
    "persistent": "persistent",
    "control": "control",
}


class Code(StrEnum):
    """Every v2 code: hello refusals, fatal errors and per-frame answers."""

    # refusals (``refused``)
    UNSUPPORTED_VERSION = "unsupported_version"
    INVALID_HELLO = "invalid_hello"
    WRONG_HOME = "wrong_home"
    DRAINING = "draining"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    TOOL_PROCESS = "tool_process"
    # fatal (``error``)
    FRAMING_ERROR = "framing_error"
    UNKNOWN_FRAME = "unknown_frame"
    PROTOCOL_ERROR = "protocol_error"
    INTERNAL_ERROR = "internal_error"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    FRAME_TIMEOUT = "frame_timeout"
    CLIENT_STALLED = "client_stalled"
    # answers to one frame
    UNKNOWN_OPERATION = "unknown_operation"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_TURN = "unknown_turn"
    SESSION_BUSY = "session_busy"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    INVALID_DEADLINE = "invalid_deadline"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    INVALID_MCP_SERVERS = "invalid_mcp_servers"
    UNKNOWN_APPROVAL = "unknown_approval"
    GRANTS_UNAVAILABLE = "grants_unavailable"
    RESYNC_REQUIRED = "resync_required"
    CONTROL_REFUSED = "control_refused"
    TURN_FINISHED = "turn_finished"
    NOT_CONTROLLER = "not_controller"
    UNKNOWN_ENTRY = "unknown_entry"
    NOT_TURN_BOUNDARY = "not_turn_boundary"
    TURN_RUNNING = "turn_running"


MESSAGES: Final[dict[Code, str]] = {
    Code.UNSUPPORTED_VERSION: "no common protocol version",
    Code.INVALID_HELLO: "the hello frame is invalid",
    Code.WRONG_HOME: "this daemon serves another MC_HOME",
    Code.DRAINING: "the daemon is stopping; retry",
    Code.TOO_MANY_CONNECTIONS: "the daemon has too many connections; retry later",
    Code.TOOL_PROCESS: "connections from the agent's tool processes are refused",
    Code.FRAMING_ERROR: "invalid frame",
    Code.UNKNOWN_FRAME: "unknown frame type",
    Code.PROTOCOL_ERROR: "frame not valid in this state",
    Code.INTERNAL_ERROR: "internal error",
    Code.HANDSHAKE_TIMEOUT: "no hello arrived in time",
    Code.FRAME_TIMEOUT: "a frame was not completed in time",
    Code.CLIENT_STALLED: "the client did not read or acknowledge output in time",
    Code.UNKNOWN_OPERATION: "unknown control operation",
    Code.INVALID_REQUEST: "the frame's arguments are invalid",
    Code.UNKNOWN_TURN: "no such turn",
    Code.SESSION_BUSY: "the session is held by another client",
    Code.DEADLINE_EXCEEDED: "the request deadline passed before it could run",
    Code.INVALID_DEADLINE: "the request deadline is invalid",
    Code.INVALID_IDEMPOTENCY_KEY: "the idempotency key is invalid",
    Code.INVALID_MCP_SERVERS: "the MCP server definitions are invalid",
}

# Frame types by sender. A client frame valid for no role is ``unknown_frame``; one valid
# for another role is ``protocol_error``.
ROLE_FRAMES: Final[dict[str, frozenset[str]]] = {
    "v1_shim": frozenset({"record", "oversize", "written", "output_failed", "eof"}),
    "persistent": frozenset(
        {
            "request",
            "take_control",
            "control",
            "snapshot",
            "attach",
            "approval_answer",
            "grants_list",
            "grants_revoke",
            "fs_result",
            "approval_policy",
            "watch",
            "unwatch",
            "control_release",
            "control_request",
            "control_answer",
            "steer",
            "sessions_list",
            "session_rename",
            "session_archive",
            "session_unarchive",
            "queue_add",
            "queue_list",
            "queue_remove",
            "queue_move",
            "queue_send_now",
            "session_transcript",
            "session_selection",
            "session_fork",
            "session_rewind",
        }
    ),
    "control": frozenset({"control"}),
}
CLIENT_FRAMES: Final = frozenset({"hello"}).union(*ROLE_FRAMES.values())
SERVER_FRAMES: Final = frozenset(
    {
        "welcome",
        "refused",
        "error",
        "output",
        "next",
        "end",
        "message",
        "overloaded",
        "control_result",
        "control_error",
        "snapshot_result",
        "attach_result",
        "attach_more",
        "attach_error",
        "snapshot_error",
        "control_granted",
        "grant_error",
        "request_error",
        "approval_request",
        "approval_resolved",
        "approval_already_resolved",
        "approval_error",
        "grants_result",
        "grants_error",
        "tool_detail",
        "fs_request",
        "approval_policy_result",
        "watch_result",
        "watch_more",
        "watch_error",
        "unwatched",
        "watch_event",
        "watch_message",
        "watch_overloaded",
        "control_released",
        "control_requested",
        "control_answered",
        "control_changed",
        "steer_result",
        "steer_error",
        "sessions_result",
        "session_result",
        "session_error",
        "queue_result",
        "queue_error",
        "transcript_result",
        "session_selection_result",
        "session_selection_error",
        "rewind_result",
    }
)
# Approval answers (``approval_answer.decision``) and grant scopes (``grants_revoke``).
APPROVAL_DECISIONS: Final = (
    "allow_once",
    "allow_session",
    "allow_project",
    "reject",
    "reject_and_stop",
)
# What a request settles as without an answer: its deadline passed, its turn ended.
APPROVAL_TIMED_OUT: Final = "timed_out"
APPROVAL_CANCELLED: Final = "cancelled"
# ``approval_resolved.by`` when no connection answered.
APPROVAL_DEADLINE_BY: Final = "deadline"
APPROVAL_TURN_ENDED_BY: Final = "turn_ended"
# ``approval_request.kind``: a shell command, a file write or edit, an MCP tool.
APPROVAL_KINDS: Final = ("command", "file_change", "mcp_tool")
GRANT_SCOPES: Final = ("session", "project")
# Approval policies (``approval_policy.policy``): the settings' values (config.approvals).
APPROVAL_POLICIES: Final = ("auto", "ask", "read_only")
GRANT_KINDS: Final = ("commands", "tools", "paths")
# ``options.editor_files``: what a persistent client's editor does for the file tools (§6.8).
EDITOR_FILE_OPS: Final = ("read", "write")
# A file's state in a ``rewind_result`` (§6.16): a preview's, then a commit's.
REWIND_FILE_STATES: Final = (
    "restore",
    "unchanged",
    "conflict",
    "not_restorable",
    "restored",
    "failed",
    "kept",
)
# An ``fs_result`` error text is cut to this many characters.
MAX_FS_ERROR_CHARS: Final = 1024


class Fatal(Exception):
    """The frame breaks the protocol: answer ``refused`` (before welcome) or ``error``."""

    def __init__(self, code: Code) -> None:
        super().__init__(code.value)
        self.code = code


class Rejected(Exception):
    """The frame is answered without being run; ``answer`` is the frame to send."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer.get("code"))
        self.answer = answer


# -- client frames ------------------------------------------------------------------------


class _Frozen:
    """What ``@dataclass(frozen=True, slots=True)`` gave the frames below: equality and
    hashing by field, a repr by field, no assignment. ``__slots__`` lists the fields in
    their order (the constructor's), hence not sorted.

    Hand-written: the stdio shim imports this module, and importing dataclasses (inspect,
    ast) and generating a dozen classes with it cost every shim start ~8 ms.
    """

    __slots__: tuple[str, ...] = ()

    def _set(self, *values: object) -> None:
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, _Frozen)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    # copy, deepcopy and pickle restore the fields past the frozen ``__setattr__``.
    def __getstate__(self) -> tuple[object, ...]:
        return self._values()

    def __setstate__(self, state: tuple[object, ...]) -> None:
        self._set(*state)


class Launch(_Frozen):
    """The frontend's launch context as sent (absolute paths, string environment).

    A ``control`` hello states only its home: ``mc_home`` is set, ``project_dir`` is ``""``
    and ``env`` is empty.
    """

    __slots__ = ("mc_home", "project_dir", "env", "umask")  # noqa: RUF023
    mc_home: str
    project_dir: str
    env: dict[str, str]
    # The frontend's file-mode creation mask; None from a client that predates the field.
    umask: int | None

    def __init__(
        self, mc_home: str, project_dir: str, env: dict[str, str], umask: int | None = None
    ) -> None:
        self._set(mc_home, project_dir, env, umask)


class Hello(_Frozen):
    __slots__ = (  # noqa: RUF023
        "role",
        "version",
        "launch",
        "client_name",
        "delta_interval_ms",
        "client_version",
        "build_id",
        "approvals",
        "tool_details",
        "editor_files",
    )
    role: Role
    version: int
    launch: Launch | None
    client_name: str
    delta_interval_ms: int
    # The client's installed package version and build (``magi_code.version``), if sent.
    client_version: str | None
    build_id: str | None
    # ``options.approvals``: this persistent client answers approval requests (§6.7).
    approvals: bool
    # ``options.tool_details``: this persistent client gets its turns' tool details (§6.8).
    tool_details: bool
    # ``options.editor_files``: the file operations its editor does for the tools (§6.8).
    editor_files: frozenset[str]

    def __init__(
        self,
        role: Role,
        version: int,
        launch: Launch | None,
        client_name: str,
        delta_interval_ms: int = 0,
        client_version: str | None = None,
        build_id: str | None = None,
        approvals: bool = False,
        tool_details: bool = False,
        editor_files: frozenset[str] = frozenset(),
    ) -> None:
        self._set(
            role,
            version,
            launch,
            client_name,
            delta_interval_ms,
            client_version,
            build_id,
            approvals,
            tool_details,
            editor_files,
        )


class Record(_Frozen):
    __slots__ = ("data",)
    data: bytes

    def __init__(self, data: bytes) -> None:
        self._set(data)


class Oversize(_Frozen):
    __slots__ = ()


class Written(_Frozen):
    __slots__ = ("seq",)
    seq: object

    def __init__(self, seq: object) -> None:
        self._set(seq)


class OutputFailed(_Frozen):
    __slots__ = ()


class Eof(_Frozen):
    __slots__ = ()


class McpServer(_Frozen):
    """One MCP server a client gives a session (§6.13). Its ``env`` values may be secrets:
    the repr names the variables only."""

    __slots__ = ("name", "command", "args", "env")  # noqa: RUF023
    name: str
    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]

    def __init__(
        self, name: str, command: str, args: tuple[str, ...], env: Mapping[str, str]
    ) -> None:
        self._set(name, command, args, env)

    def __hash__(self) -> int:
        return hash((self.name, self.command, self.args, tuple(sorted(self.env.items()))))

    def __repr__(self) -> str:
        return (
            f"McpServer(name={self.name!r}, command={self.command!r}, args={self.args!r}, "
            f"env={sorted(self.env)!r})"
        )


class Request(_Frozen):
    """A v1 request envelope as a map, with the v2 extras (deadline, idempotency key, a
    session's MCP servers)."""

    __slots__ = ("message", "request_id", "deadline_ms", "idempotency_key", "mcp_servers")  # noqa: RUF023
    message: object
    request_id: str | None
    deadline_ms: int | None
    idempotency_key: str | None
    mcp_servers: tuple[McpServer, ...] | None

    def __init__(
        self,
        message: object,
        request_id: str | None,
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
        mcp_servers: tuple[McpServer, ...] | None = None,
    ) -> None:
        self._set(message, request_id, deadline_ms, idempotency_key, mcp_servers)


class Control(_Frozen):
    __slots__ = ("id", "op")
    id: object
    op: object

    def __init__(self, id: object, op: object) -> None:
        self._set(id, op)


class TakeControl(_Frozen):
    __slots__ = ("id", "session_id")
    id: object
    session_id: object

    def __init__(self, id: object, session_id: object) -> None:
        self._set(id, session_id)


class ApprovalAnswer(_Frozen):
    __slots__ = ("id", "approval_id", "decision")  # noqa: RUF023
    id: object
    approval_id: str
    decision: str

    def __init__(self, id: object, approval_id: str, decision: str) -> None:
        self._set(id, approval_id, decision)


class FsResult(_Frozen):
    """A client's answer to ``fs_request``: the file's text (read), or an error text."""

    __slots__ = ("fs_id", "content", "error")  # noqa: RUF023
    fs_id: str
    content: str | None
    error: str | None

    def __init__(self, fs_id: str, content: str | None, error: str | None) -> None:
        self._set(fs_id, content, error)


class GrantsList(_Frozen):
    """The session's grants (with ``session_id``) and the connection's project's."""

    __slots__ = ("id", "session_id")
    id: object
    session_id: str | None

    def __init__(self, id: object, session_id: str | None) -> None:
        self._set(id, session_id)


class SessionsList(_Frozen):
    """``sessions_list``: a session library page (§6.11)."""

    __slots__ = ("id", "project_dir", "title", "archived", "cursor", "limit")  # noqa: RUF023
    id: object
    project_dir: str | None
    title: str | None
    archived: bool | str
    cursor: str | None
    limit: int

    def __init__(
        self,
        id: object,
        project_dir: str | None,
        title: str | None,
        archived: bool | str,
        cursor: str | None,
        limit: int,
    ) -> None:
        self._set(id, project_dir, title, archived, cursor, limit)


class SessionTranscript(_Frozen):
    """``session_transcript``: a page of a session's conversation with its tool calls
    (§6.14); ``start`` is the index its cursor names."""

    __slots__ = ("id", "session_id", "start")
    id: object
    session_id: str
    start: int

    def __init__(self, id: object, session_id: str, start: int) -> None:
        self._set(id, session_id, start)


class SessionChange(_Frozen):
    """``session_rename`` (with ``title``), ``session_archive``, ``session_unarchive``
    (``kind`` is its ``t``; §6.11)."""

    __slots__ = ("kind", "id", "session_id", "title")  # noqa: RUF023
    kind: str
    id: object
    session_id: str
    title: str | None

    def __init__(self, kind: str, id: object, session_id: str, title: str | None) -> None:
        self._set(kind, id, session_id, title)


class SessionFork(_Frozen):
    """``session.fork``: a new session with the history up to a cursor (§6.16)."""

    __slots__ = ("id", "session_id", "at_cursor")  # noqa: RUF023
    id: object
    session_id: str
    at_cursor: str

    def __init__(self, id: object, session_id: str, at_cursor: str) -> None:
        self._set(id, session_id, at_cursor)


class SessionRewind(_Frozen):
    """``session.rewind``: its preview, or with ``commit`` the rewind (§6.16)."""

    __slots__ = ("id", "session_id", "at_cursor", "files", "commit", "force")  # noqa: RUF023
    id: object
    session_id: str
    at_cursor: str
    files: bool
    commit: bool
    force: bool

    def __init__(
        self, id: object, session_id: str, at_cursor: str, files: bool, commit: bool, force: bool
    ) -> None:
        self._set(id, session_id, at_cursor, files, commit, force)


class SessionPolicy(_Frozen):
    """``approval_policy``: the session's own approval policy (None: the settings')."""

    __slots__ = ("id", "session_id", "policy")  # noqa: RUF023
    id: object
    session_id: str
    policy: str | None

    def __init__(self, id: object, session_id: str, policy: str | None) -> None:
        self._set(id, session_id, policy)


class SessionSelection(_Frozen):
    """``session_selection``: the session's own provider, model and reasoning level
    (§6.15); all None: the settings' again."""

    __slots__ = ("id", "session_id", "provider_id", "model_id", "thinking_level")  # noqa: RUF023
    id: object
    session_id: str
    provider_id: str | None
    model_id: str | None
    thinking_level: str | None

    def __init__(
        self,
        id: object,
        session_id: str,
        provider_id: str | None,
        model_id: str | None,
        thinking_level: str | None,
    ) -> None:
        self._set(id, session_id, provider_id, model_id, thinking_level)


class GrantsRevoke(_Frozen):
    """Remove one allow rule: ``kind`` is ``commands`` (``value`` an argv list),
    ``tools`` or ``paths`` (``value`` a string)."""

    __slots__ = ("id", "scope", "session_id", "kind", "value")  # noqa: RUF023
    id: object
    scope: str
    session_id: str | None
    kind: str
    value: tuple[str, ...] | str

    def __init__(
        self,
        id: object,
        scope: str,
        session_id: str | None,
        kind: str,
        value: tuple[str, ...] | str,
    ) -> None:
        self._set(id, scope, session_id, kind, value)


class Snapshot(_Frozen):
    __slots__ = ("id", "session_id", "turn_ids", "project_dir", "cursor")  # noqa: RUF023
    id: object
    session_id: str | None
    turn_ids: frozenset[str] | None
    project_dir: str | None
    cursor: str | None

    def __init__(
        self,
        id: object,
        session_id: str | None = None,
        turn_ids: frozenset[str] | None = None,
        project_dir: str | None = None,
        cursor: str | None = None,
    ) -> None:
        self._set(id, session_id, turn_ids, project_dir, cursor)


class Attach(_Frozen):
    __slots__ = ("id", "turn_id", "after_sequence", "session_id")  # noqa: RUF023
    id: object
    turn_id: str
    after_sequence: int
    session_id: str | None

    def __init__(
        self,
        id: object,
        turn_id: str,
        after_sequence: int = -1,
        session_id: str | None = None,
    ) -> None:
        self._set(id, turn_id, after_sequence, session_id)


class Watch(_Frozen):
    """``session.watch``: every turn and session event of a session, from a cursor."""

    __slots__ = ("id", "session_id", "after_cursor")  # noqa: RUF023
    id: object
    session_id: str
    after_cursor: str | None

    def __init__(self, id: object, session_id: str, after_cursor: str | None = None) -> None:
        self._set(id, session_id, after_cursor)


class SessionFrame(_Frozen):
    """A frame naming one session: ``unwatch``, ``control_release``, ``control_request``
    (``kind`` is its ``t``)."""

    __slots__ = ("kind", "id", "session_id")  # noqa: RUF023
    kind: str
    id: object
    session_id: str

    def __init__(self, kind: str, id: object, session_id: str) -> None:
        self._set(kind, id, session_id)


class ControlAnswer(_Frozen):
    """The controller's answer to ``control_requested``."""

    __slots__ = ("id", "session_id", "grant")  # noqa: RUF023
    id: object
    session_id: str
    grant: bool

    def __init__(self, id: object, session_id: str, grant: bool) -> None:
        self._set(id, session_id, grant)


class Steer(_Frozen):
    """``turn.steer``: text for the running turn's next provider request."""

    __slots__ = ("id", "turn_id", "text")  # noqa: RUF023
    id: object
    turn_id: str
    text: str

    def __init__(self, id: object, turn_id: str, text: str) -> None:
        self._set(id, turn_id, text)


class QueueFrame(_Frozen):
    """A prompt queue frame (§6.12; ``kind`` is its ``t``): ``text`` for ``queue_add``,
    ``entry_id`` for remove, move and send_now, ``index`` for move."""

    __slots__ = ("kind", "id", "session_id", "text", "entry_id", "index")  # noqa: RUF023
    kind: str
    id: object
    session_id: str
    text: str | None
    entry_id: str | None
    index: int | None

    def __init__(
        self,
        kind: str,
        id: object,
        session_id: str,
        text: str | None = None,
        entry_id: str | None = None,
        index: int | None = None,
    ) -> None:
        self._set(kind, id, session_id, text, entry_id, index)


ClientFrame = (
    Record
    | Oversize
    | Written
    | OutputFailed
    | Eof
    | Request
    | Control
    | TakeControl
    | Snapshot
    | Attach
    | ApprovalAnswer
    | GrantsList
    | GrantsRevoke
    | FsResult
    | SessionPolicy
    | Watch
    | SessionFrame
    | ControlAnswer
    | Steer
    | SessionsList
    | SessionChange
    | QueueFrame
    | SessionTranscript
    | SessionSelection
    | SessionFork
    | SessionRewind
)


def parse_hello(frame: Mapping[str, Any]) -> Hello:
    """Validate a client's first frame; raises :class:`Fatal` with a refusal code."""
    if frame.get("t") != "hello":
        raise Fatal(Code.INVALID_HELLO)
    versions = frame.get("protocol_versions")
    if (
        not isinstance(versions, list)
        or not 0 < len(versions) <= MAX_HELLO_VERSIONS
        or not all(_is_int(v) for v in versions)
    ):
        raise Fatal(Code.INVALID_HELLO)
    common = [v for v in versions if v in SUPPORTED_VERSIONS]
    if not common:
        raise Fatal(Code.UNSUPPORTED_VERSION)
    role = frame.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise Fatal(Code.INVALID_HELLO)
    name = frame.get("client_name", "")
    if not isinstance(name, str) or len(name) > MAX_CLIENT_NAME:
        raise Fatal(Code.INVALID_HELLO)
    options = frame.get("options", {})
    if not isinstance(options, dict):
        raise Fatal(Code.INVALID_HELLO)
    interval = options.get("delta_interval_ms", 0)
    if not _is_int(interval) or not 0 <= interval <= MAX_DELTA_INTERVAL_MS:
        raise Fatal(Code.INVALID_HELLO)
    approvals = options.get("approvals", False)
    tool_details = options.get("tool_details", False)
    if not isinstance(approvals, bool) or not isinstance(tool_details, bool):
        raise Fatal(Code.INVALID_HELLO)
    editor_files = options.get("editor_files", [])
    if not isinstance(editor_files, list) or not all(op in EDITOR_FILE_OPS for op in editor_files):
        raise Fatal(Code.INVALID_HELLO)
    persistent = role == "persistent"
    client_version = _optional_text(frame.get("client_version"), MAX_CLIENT_VERSION_CHARS)
    build_id = _optional_text(frame.get("build_id"), MAX_BUILD_ID_CHARS)
    if role == "control":
        launch = _parse_control_launch(frame.get("launch"))
    else:
        launch = _parse_launch(frame.get("launch"))
    return Hello(
        cast(Role, role),
        max(common),
        launch,
        name,
        interval,
        client_version,
        build_id,
        approvals and persistent,
        tool_details and persistent,
        frozenset(editor_files) if persistent else frozenset(),
    )


def _optional_text(value: object, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise Fatal(Code.INVALID_HELLO)
    return value


def _parse_control_launch(value: object) -> Launch | None:
    """A control hello's ``launch``: optional, and only ``mc_home`` is read (RFC-0002 §3)."""
    if value is None:
        return None  # a client that predates the field; it names no home to check
    if not isinstance(value, dict) or not _is_path(value.get("mc_home")):
        raise Fatal(Code.INVALID_HELLO)
    home = value["mc_home"]
    assert isinstance(home, str)
    return Launch(home, "", {})


def _parse_launch(value: object) -> Launch:
    if not isinstance(value, dict):
        raise Fatal(Code.INVALID_HELLO)
    home, project, env = value.get("mc_home"), value.get("project_dir"), value.get("env")
    if not _is_path(home) or not _is_path(project) or not isinstance(env, dict):
        raise Fatal(Code.INVALID_HELLO)
    if len(env) > MAX_ENV_ENTRIES:
        raise Fatal(Code.INVALID_HELLO)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise Fatal(Code.INVALID_HELLO)
    umask = value.get("umask")
    if umask is not None and (not _is_int(umask) or not 0 <= umask <= 0o777):
        raise Fatal(Code.INVALID_HELLO)
    assert isinstance(home, str) and isinstance(project, str)
    return Launch(home, project, dict(env), umask)


def decode(frame: Mapping[str, Any], role: str) -> ClientFrame:
    """A client frame after ``hello``, as a typed value.

    Raises :class:`Fatal` (``unknown_frame``, ``protocol_error``) or :class:`Rejected`
    (the frame's non-fatal answer, e.g. ``attach_error``/``request_error``).
    """
    kind = frame.get("t")
    if not isinstance(kind, str) or kind not in CLIENT_FRAMES:
        raise Fatal(Code.UNKNOWN_FRAME)
    if kind not in ROLE_FRAMES[role]:
        raise Fatal(Code.PROTOCOL_ERROR)
    match kind:
        case "record":
            data = frame.get("data")
            if not isinstance(data, bytes):
                raise Fatal(Code.PROTOCOL_ERROR)
            # The daemon holds a record to the v1 bound itself, as the shim's framer does
            # (a frame may carry far more): over it, the record is discarded.
            return Record(data) if fits_record(len(data)) else Oversize()
        case "oversize":
            return Oversize()
        case "written":
            return Written(frame.get("seq"))
        case "output_failed":
            return OutputFailed()
        case "eof":
            return Eof()
        case "request":
            return _request(frame)
        case "control":
            return Control(frame.get("id"), frame.get("op"))
        case "take_control":
            return TakeControl(frame.get("id"), frame.get("session_id"))
        case "snapshot":
            return _snapshot(frame)
        case "approval_answer":
            return _approval_answer(frame)
        case "grants_list":
            return _grants_list(frame)
        case "grants_revoke":
            return _grants_revoke(frame)
        case "fs_result":
            return _fs_result(frame)
        case "approval_policy":
            return _session_policy(frame)
        case "watch":
            return _watch(frame)
        case "unwatch" | "control_release" | "control_request":
            return _session_frame(kind, frame)
        case "control_answer":
            return _control_answer(frame)
        case "steer":
            return _steer(frame)
        case "sessions_list":
            return _sessions_list(frame)
        case "session_rename" | "session_archive" | "session_unarchive":
            return _session_change(kind, frame)
        case "queue_add" | "queue_list" | "queue_remove" | "queue_move" | "queue_send_now":
            return _queue_frame(kind, frame)
        case "session_transcript":
            return _session_transcript(frame)
        case "session_selection":
            return _session_selection(frame)
        case "session_fork" | "session_rewind":
            return _fork_or_rewind(kind, frame)
        case _:
            return _attach(frame)


def _request(frame: Mapping[str, Any]) -> Request:
    message = frame.get("message")
    rid = message.get("request_id") if isinstance(message, dict) else None
    request_id = rid if isinstance(rid, str) else None
    deadline = frame.get("deadline_ms")
    if deadline is not None and not _is_int(deadline):
        raise Rejected(request_error(request_id, Code.INVALID_DEADLINE))
    key = frame.get("idempotency_key")
    if key is not None and not valid_idempotency_key(key):
        raise Rejected(request_error(request_id, Code.INVALID_IDEMPOTENCY_KEY))
    servers = frame.get("mcp_servers")
    if servers is not None:
        servers = mcp_servers(servers)
        if servers is None:
            raise Rejected(request_error(request_id, Code.INVALID_MCP_SERVERS))
    return Request(message, request_id, deadline, key, servers)


def mcp_servers(value: object) -> tuple[McpServer, ...] | None:
    """A ``request`` frame's ``mcp_servers`` (§6.13); None when it breaks the rules."""
    if not isinstance(value, list) or len(value) > MAX_SESSION_MCP_SERVERS:
        return None
    servers: list[McpServer] = []
    size = 0
    for item in value:
        if not isinstance(item, dict) or not set(item) <= {"name", "command", "args", "env"}:
            return None
        name, command = item.get("name"), item.get("command")
        args, env = item.get("args", []), item.get("env", {})
        if not (
            isinstance(name, str)
            and MCP_SERVER_NAME.fullmatch(name)
            and isinstance(command, str)
            and command
            and "\0" not in command
            and isinstance(args, list)
            and all(isinstance(a, str) and "\0" not in a for a in args)
            and isinstance(env, dict)
            and all(
                isinstance(k, str)
                and _ENV_NAME.fullmatch(k)
                and isinstance(v, str)
                and "\0" not in v
                for k, v in env.items()
            )
        ):
            return None
        strings = [name, command, *args, *env, *env.values()]
        size += sum(len(text.encode("utf-8", "surrogatepass")) for text in strings)
        if size > MAX_SESSION_MCP_BYTES or name in (s.name for s in servers):
            return None
        servers.append(McpServer(name, command, tuple(args), dict(env)))
    return tuple(servers)


def _snapshot(frame: Mapping[str, Any]) -> Snapshot:
    fid = frame.get("id")
    session_id = frame.get("session_id")
    turn_ids = frame.get("turn_ids")
    project_dir = frame.get("project_dir")
    cursor = frame.get("cursor")
    ok = (
        _optional_id(session_id)
        and _optional_id(cursor, MAX_CURSOR_BYTES)
        and (project_dir is None or _is_path(project_dir))
        and (
            turn_ids is None
            or (
                isinstance(turn_ids, list)
                and len(turn_ids) <= MAX_FILTER_TURN_IDS
                and all(_optional_id(t) and t is not None for t in turn_ids)
            )
        )
    )
    if not ok:
        raise Rejected(frame_error("snapshot_error", fid, Code.INVALID_REQUEST))
    return Snapshot(
        fid,
        session_id,
        None if turn_ids is None else frozenset(turn_ids),
        project_dir,
        cursor,
    )


def _attach(frame: Mapping[str, Any]) -> Attach:
    fid = frame.get("id")
    turn_id, after, session_id = (
        frame.get("turn_id"),
        frame.get("after_sequence", -1),
        frame.get("session_id"),
    )
    if after is None:
        after = -1
    if not (isinstance(turn_id, str) and turn_id and _optional_id(turn_id)):
        raise Rejected(frame_error("attach_error", fid, Code.INVALID_REQUEST))
    if not _is_int(after) or not _optional_id(session_id):
        raise Rejected(frame_error("attach_error", fid, Code.INVALID_REQUEST))
    return Attach(fid, turn_id, after, session_id)


def _approval_answer(frame: Mapping[str, Any]) -> ApprovalAnswer:
    fid, approval_id, decision = frame.get("id"), frame.get("approval_id"), frame.get("decision")
    if not (isinstance(approval_id, str) and approval_id and _optional_id(approval_id)):
        raise Rejected(frame_error("approval_error", fid, Code.INVALID_REQUEST))
    if decision not in APPROVAL_DECISIONS:
        raise Rejected(frame_error("approval_error", fid, Code.INVALID_REQUEST))
    assert isinstance(decision, str)
    return ApprovalAnswer(fid, approval_id, decision)


def _fs_result(frame: Mapping[str, Any]) -> FsResult:
    """It answers no ``id``: a malformed one is a protocol error (§6.8)."""
    fs_id, content, error = frame.get("fs_id"), frame.get("content"), frame.get("error")
    if not (isinstance(fs_id, str) and fs_id and _optional_id(fs_id)):
        raise Fatal(Code.PROTOCOL_ERROR)
    if not isinstance(content, str | None) or not isinstance(error, str | None):
        raise Fatal(Code.PROTOCOL_ERROR)
    return FsResult(fs_id, content, None if error is None else error[:MAX_FS_ERROR_CHARS])


def _sessions_list(frame: Mapping[str, Any]) -> SessionsList:
    fid, project_dir, title = frame.get("id"), frame.get("project_dir"), frame.get("title")
    archived, cursor = frame.get("archived", False), frame.get("cursor")
    limit = frame.get("limit", MAX_SESSION_PAGE_ITEMS)
    ok = (
        (project_dir is None or _is_path(project_dir))
        and (title is None or (isinstance(title, str) and 0 < len(title) <= MAX_TITLE_FILTER))
        and archived in (False, True, "all")
        and type(archived) in (bool, str)
        and _optional_id(cursor, MAX_CURSOR_BYTES)
        and _is_int(limit)
        and 0 < limit <= MAX_SESSION_PAGE_ITEMS
    )
    if not ok:
        raise Rejected(frame_error("session_error", fid, Code.INVALID_REQUEST))
    return SessionsList(fid, project_dir, title, archived, cursor, limit)


def _session_transcript(frame: Mapping[str, Any]) -> SessionTranscript:
    fid, session_id, cursor = frame.get("id"), frame.get("session_id"), frame.get("cursor")
    ok = isinstance(session_id, str) and _optional_id(session_id)
    if cursor is not None and not (
        isinstance(cursor, str) and _TRANSCRIPT_CURSOR.fullmatch(cursor)
    ):
        ok = False
    if not ok or not isinstance(session_id, str):
        raise Rejected(frame_error("session_error", fid, Code.INVALID_REQUEST))
    return SessionTranscript(fid, session_id, 0 if cursor is None else int(cursor))


def _session_change(kind: str, frame: Mapping[str, Any]) -> SessionChange:
    fid, session_id, title = frame.get("id"), frame.get("session_id"), frame.get("title")
    ok = _optional_id(session_id)
    if kind == "session_rename":
        ok = ok and isinstance(title, str) and 0 < len(title) <= MAX_TITLE_FILTER
    if not ok or not isinstance(session_id, str):
        raise Rejected(frame_error("session_error", fid, Code.INVALID_REQUEST))
    return SessionChange(kind, fid, session_id, title if kind == "session_rename" else None)


def _fork_or_rewind(kind: str, frame: Mapping[str, Any]) -> SessionFork | SessionRewind:
    fid, session_id, cursor = frame.get("id"), frame.get("session_id"), frame.get("at_cursor")
    flags = [frame.get(name, default) for name, default in _REWIND_FLAGS]
    ok = (
        isinstance(session_id, str)
        and _optional_id(session_id)
        and isinstance(cursor, str)
        and _optional_id(cursor, MAX_CURSOR_BYTES)
        and all(isinstance(flag, bool) for flag in flags)
    )
    if not ok:
        raise Rejected(frame_error("session_error", fid, Code.INVALID_REQUEST))
    assert isinstance(session_id, str) and isinstance(cursor, str)
    if kind == "session_fork":
        return SessionFork(fid, session_id, cursor)
    files, commit, force = (bool(flag) for flag in flags)
    return SessionRewind(fid, session_id, cursor, files, commit, force)


# ``session_rewind``'s flags and their defaults (``session_fork`` has none: all default).
_REWIND_FLAGS: Final = (("files", True), ("commit", False), ("force", False))


def _grants_list(frame: Mapping[str, Any]) -> GrantsList:
    fid, session_id = frame.get("id"), frame.get("session_id")
    if not _optional_id(session_id):
        raise Rejected(frame_error("grants_error", fid, Code.INVALID_REQUEST))
    return GrantsList(fid, session_id)


def _grants_revoke(frame: Mapping[str, Any]) -> GrantsRevoke:
    fid, scope, session_id = frame.get("id"), frame.get("scope"), frame.get("session_id")
    kind, value = frame.get("kind"), frame.get("value")
    ok = (
        scope in GRANT_SCOPES
        and kind in GRANT_KINDS
        and _optional_id(session_id)
        and (scope == "project" or session_id is not None)
    )
    if kind == "commands":
        ok = ok and isinstance(value, list) and 0 < len(value) <= 64
        ok = ok and all(isinstance(word, str) for word in value)  # type: ignore[union-attr]
    else:
        ok = ok and isinstance(value, str) and 0 < len(value) <= MAX_PATH_BYTES
    if not ok:
        raise Rejected(frame_error("grants_error", fid, Code.INVALID_REQUEST))
    assert isinstance(scope, str) and isinstance(kind, str)
    rule = tuple(value) if isinstance(value, list) else value
    assert isinstance(rule, tuple | str)
    return GrantsRevoke(fid, scope, session_id, kind, rule)


def _session_policy(frame: Mapping[str, Any]) -> SessionPolicy:
    fid, session_id, policy = frame.get("id"), frame.get("session_id"), frame.get("policy")
    if not (isinstance(session_id, str) and _optional_id(session_id)):
        raise Rejected(frame_error("approval_error", fid, Code.INVALID_REQUEST))
    if policy is not None and policy not in APPROVAL_POLICIES:
        raise Rejected(frame_error("approval_error", fid, Code.INVALID_REQUEST))
    assert policy is None or isinstance(policy, str)
    return SessionPolicy(fid, session_id, policy)


def _session_selection(frame: Mapping[str, Any]) -> SessionSelection:
    fid, session_id = frame.get("id"), frame.get("session_id")
    provider, model, level = (frame.get(k) for k in ("provider_id", "model_id", "thinking_level"))
    chosen = provider is not None or model is not None or level is not None
    ok = (
        isinstance(session_id, str)
        and _optional_id(session_id)
        and (not chosen or (_selection_id(provider) and _selection_id(model)))
        and (level is None or level in THINKING_LEVELS)
    )
    if not ok or not isinstance(session_id, str):
        raise Rejected(frame_error("session_selection_error", fid, Code.INVALID_REQUEST))
    return SessionSelection(fid, session_id, provider, model, level)


def _selection_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_SELECTION_ID_CHARS


# Where a session frame's bad arguments are answered.
_SESSION_FRAME_ERRORS: Final = {
    "watch": "watch_error",
    "unwatch": "watch_error",
    "control_release": "grant_error",
    "control_request": "grant_error",
    "control_answer": "grant_error",
}


def _session_id(kind: str, frame: Mapping[str, Any]) -> str:
    session_id = frame.get("session_id")
    if not (isinstance(session_id, str) and session_id and _optional_id(session_id)):
        raise Rejected(
            frame_error(_SESSION_FRAME_ERRORS[kind], frame.get("id"), Code.INVALID_REQUEST)
        )
    return session_id


def _watch(frame: Mapping[str, Any]) -> Watch:
    session_id = _session_id("watch", frame)
    cursor = frame.get("after_cursor")
    if not _optional_id(cursor, MAX_CURSOR_BYTES):
        raise Rejected(frame_error("watch_error", frame.get("id"), Code.INVALID_REQUEST))
    return Watch(frame.get("id"), session_id, cursor)


def _session_frame(kind: str, frame: Mapping[str, Any]) -> SessionFrame:
    return SessionFrame(kind, frame.get("id"), _session_id(kind, frame))


def _control_answer(frame: Mapping[str, Any]) -> ControlAnswer:
    session_id = _session_id("control_answer", frame)
    grant = frame.get("grant")
    if not isinstance(grant, bool):
        raise Rejected(frame_error("grant_error", frame.get("id"), Code.INVALID_REQUEST))
    return ControlAnswer(frame.get("id"), session_id, grant)


def _steer(frame: Mapping[str, Any]) -> Steer:
    fid, turn_id, text = frame.get("id"), frame.get("turn_id"), frame.get("text")
    if not (isinstance(turn_id, str) and turn_id and _optional_id(turn_id)):
        raise Rejected(frame_error("steer_error", fid, Code.INVALID_REQUEST))
    # A steer becomes a user record: the v1 bound of a prompt holds it too.
    if not isinstance(text, str) or not text.strip() or len(text.encode()) > MAX_STRING_BYTES:
        raise Rejected(frame_error("steer_error", fid, Code.INVALID_REQUEST))
    return Steer(fid, turn_id, text)


def _queue_frame(kind: str, frame: Mapping[str, Any]) -> QueueFrame:
    fid, session_id = frame.get("id"), frame.get("session_id")
    text, entry_id, index = frame.get("text"), frame.get("entry_id"), frame.get("index")
    ok = isinstance(session_id, str) and bool(session_id) and _optional_id(session_id)
    if kind == "queue_add":
        # An entry becomes a turn's prompt: the v1 bound of a prompt holds it too.
        ok = ok and isinstance(text, str) and bool(text.strip())
        ok = ok and len(str(text).encode()) <= MAX_STRING_BYTES
    elif kind != "queue_list":
        ok = ok and isinstance(entry_id, str) and bool(entry_id) and _optional_id(entry_id)
    if kind == "queue_move":
        ok = ok and _is_int(index) and 0 <= index <= MAX_QUEUE_INDEX
    if not ok:
        raise Rejected(frame_error("queue_error", fid, Code.INVALID_REQUEST))
    assert isinstance(session_id, str)
    return QueueFrame(
        kind,
        fid,
        session_id,
        text if kind == "queue_add" else None,
        entry_id if isinstance(entry_id, str) and kind != "queue_list" else None,
        index if kind == "queue_move" else None,
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_path(value: object) -> bool:
    return (
        isinstance(value, str)
        and value.startswith("/")
        and "\x00" not in value
        and len(value.encode("utf-8", "surrogatepass")) <= MAX_PATH_BYTES
    )


def _optional_id(value: object, limit: int = 128) -> bool:
    if value is None:
        return True
    return (
        isinstance(value, str)
        and 0 < len(value.encode("utf-8", "surrogatepass")) <= limit
        and value.isprintable()
    )


# -- client frames ------------------------------------------------------------------------


def record(data: bytes) -> dict[str, Any]:
    """One v1 stdin record the shim forwards."""
    return {"t": "record", "data": data}


def oversize() -> dict[str, Any]:
    """A stdin record over the v1 limit: the daemon answers it ``record_too_large``."""
    return {"t": "oversize"}


def written(seq: object) -> dict[str, Any]:
    """The shim wrote ``output`` ``seq`` (echoed as the daemon sent it) to stdout."""
    return {"t": "written", "seq": seq}


def output_failed() -> dict[str, Any]:
    """The shim could not write an ``output`` to stdout."""
    return {"t": "output_failed"}


def eof() -> dict[str, Any]:
    return {"t": "eof"}


def request(
    envelope: Mapping[str, Any],
    deadline_ms: int | None = None,
    idempotency_key: str | None = None,
    mcp_servers: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A v1 request envelope, with the v2 members a persistent client may add (§6.13)."""
    frame: dict[str, Any] = {"t": "request", "message": envelope}
    if deadline_ms is not None:
        frame["deadline_ms"] = deadline_ms
    if idempotency_key is not None:
        frame["idempotency_key"] = idempotency_key
    if mcp_servers is not None:
        frame["mcp_servers"] = [dict(server) for server in mcp_servers]
    return frame


def fs_result(fs_id: str, content: str | None, error: str | None) -> dict[str, Any]:
    """The editor's answer to an ``fs_request`` (§6.8)."""
    frame: dict[str, Any] = {"t": "fs_result", "fs_id": fs_id}
    if content is not None:
        frame["content"] = content
    if error is not None:
        frame["error"] = error
    return frame


# The frames below the daemon answers by ``id``; ``id`` comes last, after the members.


def control(frame_id: int, op: str) -> dict[str, Any]:
    """``control``: ``status``, ``stop`` or ``restart`` (§4)."""
    return {"t": "control", "op": op, "id": frame_id}


def snapshot(
    frame_id: int,
    session_id: str | None = None,
    project_dir: str | None = None,
    turn_ids: Sequence[str] | None = None,
    cursor: str | None = None,
) -> dict[str, Any]:
    """``snapshot``: a page of the turns the daemon knows, filtered (None: no filter)."""
    frame: dict[str, Any] = {"t": "snapshot"}
    if session_id is not None:
        frame["session_id"] = session_id
    if project_dir is not None:
        frame["project_dir"] = project_dir
    if turn_ids is not None:
        frame["turn_ids"] = list(turn_ids)
    if cursor is not None:
        frame["cursor"] = cursor
    frame["id"] = frame_id
    return frame


def attach(
    frame_id: int, turn_id: str, after_sequence: int = -1, session_id: str | None = None
) -> dict[str, Any]:
    """``attach``: a turn's events after ``after_sequence``, then its live ones."""
    frame: dict[str, Any] = {"t": "attach", "turn_id": turn_id, "after_sequence": after_sequence}
    if session_id is not None:
        frame["session_id"] = session_id
    frame["id"] = frame_id
    return frame


def take_control(frame_id: int, session_id: str) -> dict[str, Any]:
    """``take_control``: become the session's controller (§6.1)."""
    return {"t": "take_control", "session_id": session_id, "id": frame_id}


def control_request(frame_id: int, session_id: str) -> dict[str, Any]:
    """``control_request``: ask the session's controller for it (§6.1)."""
    return {"t": "control_request", "session_id": session_id, "id": frame_id}


def control_release(frame_id: int, session_id: str) -> dict[str, Any]:
    """``control_release``: give up this connection's hold of the session."""
    return {"t": "control_release", "session_id": session_id, "id": frame_id}


def control_answer(frame_id: int, session_id: str, grant: bool) -> dict[str, Any]:
    """``control_answer``: the controller's answer to ``control_requested``."""
    return {"t": "control_answer", "session_id": session_id, "grant": grant, "id": frame_id}


def watch(frame_id: int, session_id: str, after_cursor: str | None = None) -> dict[str, Any]:
    """``watch``: a session's history after the cursor, then its live turns (§6.9)."""
    frame: dict[str, Any] = {"t": "watch", "session_id": session_id}
    if after_cursor is not None:
        frame["after_cursor"] = after_cursor
    frame["id"] = frame_id
    return frame


def unwatch(frame_id: int, session_id: str) -> dict[str, Any]:
    """``unwatch``: stop watching the session."""
    return {"t": "unwatch", "session_id": session_id, "id": frame_id}


def approval_answer(frame_id: int, approval_id: str, decision: str) -> dict[str, Any]:
    """``approval_answer``: one of an ``approval_request``'s options (§6.7)."""
    return {
        "t": "approval_answer",
        "approval_id": approval_id,
        "decision": decision,
        "id": frame_id,
    }


def grants_list(frame_id: int, session_id: str | None) -> dict[str, Any]:
    """``grants_list``: the session's grants (with ``session_id``) and the project's."""
    return {"t": "grants_list", "session_id": session_id, "id": frame_id}


def grants_revoke(
    frame_id: int, scope: str, kind: str, value: Sequence[str] | str, session_id: str | None
) -> dict[str, Any]:
    """``grants_revoke``: remove one grant (``value`` an argv list for ``commands``)."""
    frame: dict[str, Any] = {
        "t": "grants_revoke",
        "scope": scope,
        "kind": kind,
        "value": value if isinstance(value, str) else list(value),
    }
    if session_id is not None:
        frame["session_id"] = session_id
    frame["id"] = frame_id
    return frame


def approval_policy(frame_id: int, session_id: str, policy: str | None) -> dict[str, Any]:
    """``approval_policy``: the session's own approval policy (None: the settings')."""
    return {"t": "approval_policy", "session_id": session_id, "policy": policy, "id": frame_id}


def session_selection(
    frame_id: int,
    session_id: str,
    provider_id: str | None,
    model_id: str | None,
    thinking_level: str | None,
) -> dict[str, Any]:
    """``session_selection``: the session's own provider, model, reasoning (§6.15)."""
    return {
        "t": "session_selection",
        "session_id": session_id,
        "provider_id": provider_id,
        "model_id": model_id,
        "thinking_level": thinking_level,
        "id": frame_id,
    }


def steer(frame_id: int, turn_id: str, text: str) -> dict[str, Any]:
    """``steer``: text for the running turn (§6.10)."""
    return {"t": "steer", "turn_id": turn_id, "text": text, "id": frame_id}


def queue_list(frame_id: int, session_id: str) -> dict[str, Any]:
    """``queue_list``: the session's queued prompts (§6.12)."""
    return {"t": "queue_list", "session_id": session_id, "id": frame_id}


def queue_add(frame_id: int, session_id: str, text: str) -> dict[str, Any]:
    """``queue_add``: a prompt at the queue's tail."""
    return {"t": "queue_add", "session_id": session_id, "text": text, "id": frame_id}


def queue_remove(frame_id: int, session_id: str, entry_id: str) -> dict[str, Any]:
    """``queue_remove``: drop an entry."""
    return {"t": "queue_remove", "session_id": session_id, "entry_id": entry_id, "id": frame_id}


def queue_move(frame_id: int, session_id: str, entry_id: str, index: int) -> dict[str, Any]:
    """``queue_move``: move an entry to ``index``."""
    return {
        "t": "queue_move",
        "session_id": session_id,
        "entry_id": entry_id,
        "index": index,
        "id": frame_id,
    }


def queue_send_now(frame_id: int, session_id: str, entry_id: str) -> dict[str, Any]:
    """``queue_send_now``: steer the entry into the running turn, or run it next."""
    return {"t": "queue_send_now", "session_id": session_id, "entry_id": entry_id, "id": frame_id}


def sessions_list(
    frame_id: int,
    archived: bool | str,
    limit: int,
    project_dir: str | None = None,
    title: str | None = None,
    cursor: str | None = None,
) -> dict[str, Any]:
    """``sessions_list``: a session library page (§6.11)."""
    frame: dict[str, Any] = {"t": "sessions_list", "archived": archived, "limit": limit}
    for name, value in (("project_dir", project_dir), ("title", title), ("cursor", cursor)):
        if value is not None:
            frame[name] = value
    frame["id"] = frame_id
    return frame


def session_rename(frame_id: int, session_id: str, title: str) -> dict[str, Any]:
    """``session_rename``: the session's explicit title."""
    return {"t": "session_rename", "session_id": session_id, "title": title, "id": frame_id}


def session_archive(frame_id: int, session_id: str) -> dict[str, Any]:
    """``session_archive``: hide the session from the default lists."""
    return {"t": "session_archive", "session_id": session_id, "id": frame_id}


def session_unarchive(frame_id: int, session_id: str) -> dict[str, Any]:
    """``session_unarchive``: show an archived session in the default lists again."""
    return {"t": "session_unarchive", "session_id": session_id, "id": frame_id}


def session_transcript(frame_id: int, session_id: str, cursor: str | None = None) -> dict[str, Any]:
    """``session_transcript``: a page of the conversation with its tool calls (§6.14)."""
    frame: dict[str, Any] = {"t": "session_transcript", "session_id": session_id}
    if cursor is not None:
        frame["cursor"] = cursor
    frame["id"] = frame_id
    return frame


def session_fork(frame_id: int, session_id: str, at_cursor: str) -> dict[str, Any]:
    """``session_fork``: a new session with the history up to ``at_cursor`` (§6.16)."""
    return {"t": "session_fork", "session_id": session_id, "at_cursor": at_cursor, "id": frame_id}


def session_rewind(
    frame_id: int, session_id: str, at_cursor: str, files: bool, commit: bool, force: bool
) -> dict[str, Any]:
    """``session_rewind``: the preview of going back to ``at_cursor``, or with ``commit``
    the rewind (§6.16)."""
    return {
        "t": "session_rewind",
        "session_id": session_id,
        "at_cursor": at_cursor,
        "files": files,
        "commit": commit,
        "force": force,
        "id": frame_id,
    }


def call_type(frame: Mapping[str, Any]) -> str:
    """The type of a frame a builder above made."""
    return str(frame["t"])


# -- daemon frames ------------------------------------------------------------------------


def hello(
    role: Role,
    launch: Launch | None,
    client_name: str,
    version: str,
    options: Mapping[str, Any] | None = None,
    build_id: str | None = None,
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "t": "hello",
        "protocol_versions": list(SUPPORTED_VERSIONS),
        "client_name": client_name[:MAX_CLIENT_NAME],
        "client_version": version[:MAX_CLIENT_VERSION_CHARS],
        "role": role,
        "options": dict(options or {}),
    }
    if build_id is not None:
        frame["build_id"] = build_id
    if launch is not None and role == "control":
        frame["launch"] = {"mc_home": launch.mc_home}  # a control hello names its home only
    elif launch is not None:
        frame["launch"] = {
            "mc_home": launch.mc_home,
            "project_dir": launch.project_dir,
            "env": dict(launch.env),
        }
        if launch.umask is not None:
            frame["launch"]["umask"] = launch.umask
    return frame


def refused(code: Code) -> dict[str, Any]:
    return {"t": "refused", "code": code.value, "message": MESSAGES[code]}


def error(code: Code) -> dict[str, Any]:
    return {"t": "error", "code": code.value, "message": MESSAGES[code]}


def request_error(request_id: object, code: Code) -> dict[str, Any]:
    rid = request_id if isinstance(request_id, str) else None
    return {"t": "request_error", "request_id": rid, "code": code.value, "message": MESSAGES[code]}


def frame_error(
    kind: str, frame_id: object, code: StrEnum | str, entry_id: str | None = None
) -> dict[str, Any]:
    """A non-fatal answer to one frame (``attach_error``, ``grant_error``, ...); a
    ``steer_error`` may name the queue ``entry_id`` its text went to (§6.12)."""
    frame: dict[str, Any] = {"t": kind, "id": frame_id, "code": str(code)}
    if entry_id is not None:
        frame["entry_id"] = entry_id
    return frame


def welcome(
    server_version: str,
    build_id: str,
    instance_id: str,
    pid: int,
    role: str,
    limits: Mapping[str, Any],
    capabilities: Sequence[str],
) -> dict[str, Any]:
    return {
        "t": "welcome",
        "protocol_version": PROTOCOL_VERSION,
        "server_name": "magi-code",
        "server_version": server_version,
        "build_id": build_id,
        "instance_id": instance_id,
        "pid": pid,
        "role": role,
        "lifetime": ROLES[role],
        "limits": dict(limits),
        "capabilities": list(capabilities),
    }


def output(
    seq: int,
    data: bytes,
    answers: bool,
    failures: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """v1 output bytes for the shim; ``answers``: they answer its oldest record (no
    ``next`` came for it); ``failures``: the turns that failed in them."""
    frame: dict[str, Any] = {"t": "output", "seq": seq, "data": data}
    if answers:
        frame["answers"] = True
    if failures:
        frame["failures"] = [dict(failure) for failure in failures]
    return frame


def next_record() -> dict[str, Any]:
    """The shim's record was taken; its answer comes later."""
    return {"t": "next"}


def end(status: str, detail: str | None) -> dict[str, Any]:
    return {"t": "end", "status": status, "detail": detail}


def control_result(frame_id: object, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"t": "control_result", "id": frame_id, "result": dict(result)}


def control_granted(
    frame_id: object, session_id: str | None, turns: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    return {"t": "control_granted", "id": frame_id, "session_id": session_id, "turns": list(turns)}


def control_released(frame_id: object, session_id: str) -> dict[str, Any]:
    return {"t": "control_released", "id": frame_id, "session_id": session_id}


def control_answered(frame_id: object, session_id: str) -> dict[str, Any]:
    return {"t": "control_answered", "id": frame_id, "session_id": session_id}


def control_requested(session_id: str, by: str, timeout_ms: int) -> dict[str, Any]:
    """To a session's controller: another client asks for control."""
    return {"t": "control_requested", "session_id": session_id, "by": by, "timeout_ms": timeout_ms}


def control_changed(session_id: str, controller: str | None) -> dict[str, Any]:
    """To the client that lost control of a session."""
    return {"t": "control_changed", "session_id": session_id, "controller": controller}


def grants_result(
    frame_id: object,
    session: Mapping[str, Any] | None,
    project: Mapping[str, Any],
    project_honoured: bool,
) -> dict[str, Any]:
    return {
        "t": "grants_result",
        "id": frame_id,
        "session": None if session is None else dict(session),
        "project": dict(project),
        "project_honoured": project_honoured,
    }


def approval_policy_result(
    frame_id: object, session_id: str, policy: str | None, effective: str | None
) -> dict[str, Any]:
    return {
        "t": "approval_policy_result",
        "id": frame_id,
        "session_id": session_id,
        "policy": policy,
        "effective": effective,
    }


def sessions_result(
    frame_id: object,
    sessions: Sequence[Mapping[str, Any]],
    next_cursor: str | None,
    incomplete: bool,
) -> dict[str, Any]:
    """A page of the session library (§6.11)."""
    return {
        "t": "sessions_result",
        "id": frame_id,
        "sessions": list(sessions),
        "next_cursor": next_cursor,
        "incomplete": incomplete,
    }


def session_result(frame_id: object, session: Mapping[str, Any]) -> dict[str, Any]:
    """One session's library entry (after a change, or a fork's new session)."""
    return {"t": "session_result", "id": frame_id, "session": session}


def transcript_result(
    frame_id: object, items: Sequence[Mapping[str, Any]], next_cursor: str | None, gap: bool
) -> dict[str, Any]:
    """A page of a session's conversation (§6.14)."""
    return {
        "t": "transcript_result",
        "id": frame_id,
        "items": list(items),
        "next_cursor": next_cursor,
        "gap": gap,
    }


def session_selection_result(
    frame_id: object, session_id: str, effective: Mapping[str, Any]
) -> dict[str, Any]:
    """A session's effective selection and reasoning (§6.15)."""
    return {
        "t": "session_selection_result",
        "id": frame_id,
        "session_id": session_id,
        "effective": effective,
    }


def rewind_result(frame_id: object, answer: Mapping[str, Any]) -> dict[str, Any]:
    """A rewind's preview or outcome (§6.16): its ``files``, ``messages`` and the rest of
    ``session.rewind``'s answer."""
    return {"t": "rewind_result", "id": frame_id, **answer}


def queue_result(
    frame_id: object,
    session_id: str,
    entries: Sequence[Mapping[str, Any]],
    entry_id: str | None = None,
) -> dict[str, Any]:
    """The session's prompt queue after a change (§6.12); ``entry_id``: the added entry."""
    frame: dict[str, Any] = {
        "t": "queue_result",
        "id": frame_id,
        "session_id": session_id,
        "entries": list(entries),
    }
    if entry_id is not None:
        frame["entry_id"] = entry_id
    return frame


def steer_result(frame_id: object, turn_id: str) -> dict[str, Any]:
    return {"t": "steer_result", "id": frame_id, "turn_id": turn_id}


def unwatched(frame_id: object, session_id: str) -> dict[str, Any]:
    return {"t": "unwatched", "id": frame_id, "session_id": session_id}


def watch_overloaded(session_id: str) -> dict[str, Any]:
    """The watcher fell behind: it no longer watches the session."""
    return {"t": "watch_overloaded", "session_id": session_id}


def tool_detail(
    activity_id: str, detail: Mapping[str, Any], turn_id: str, session_id: str
) -> dict[str, Any]:
    """A running tool call's ``call`` or ``diff`` (§6.8)."""
    return {
        "t": "tool_detail",
        "activity_id": activity_id,
        **detail,
        "turn_id": turn_id,
        "session_id": session_id,
    }


def fs_request(
    fs_id: str, op: str, path: str, content: str | None, turn_id: str, session_id: str
) -> dict[str, Any]:
    """A tool asks the editor to read or write a file (§6.8)."""
    frame: dict[str, Any] = {"t": "fs_request", "fs_id": fs_id, "op": op, "path": path}
    if content is not None:
        frame["content"] = content
    frame["turn_id"] = turn_id
    frame["session_id"] = session_id
    return frame


def message(envelope: Mapping[str, Any]) -> dict[str, Any]:
    return {"t": "message", "message": envelope}


def snapshot_result(
    frame_id: object, turns: Sequence[Mapping[str, Any]], next_cursor: str | None
) -> dict[str, Any]:
    return {
        "t": "snapshot_result",
        "id": frame_id,
        "turns": list(turns),
        "next_cursor": next_cursor,
    }


def attach_result(
    frame_id: object,
    status: str,
    events: Sequence[Mapping[str, Any]],
    more: bool,
    failure: str | None = None,
) -> dict[str, Any]:
    """``failure``: the label of a failed turn's terminal (its ``failure``), else None."""
    return {
        "t": "attach_result",
        "id": frame_id,
        "status": status,
        "events": list(events),
        "more": more,
        "failure": failure,
    }


def attach_more(
    frame_id: object, events: Sequence[Mapping[str, Any]], more: bool
) -> dict[str, Any]:
    return {"t": "attach_more", "id": frame_id, "events": list(events), "more": more}


def approval_request(
    approval_id: str,
    turn_id: str,
    session_id: str,
    kind: str,
    activity_id: str | None,
    summary: Mapping[str, Any],
    options: Sequence[str],
    deadline_ms: int,
) -> dict[str, Any]:
    """A tool call waits for a person's answer (§6.7)."""
    return {
        "t": "approval_request",
        "approval_id": approval_id,
        "turn_id": turn_id,
        "session_id": session_id,
        "kind": kind,
        "activity_id": activity_id,
        "summary": dict(summary),
        "options": list(options),
        "deadline_ms": deadline_ms,
    }


def approval_resolved(
    approval_id: str, decision: str, by: str, *, already: bool = False, frame_id: object = None
) -> dict[str, Any]:
    """``approval_resolved`` to every attached connection, or, to a later answer,
    ``approval_already_resolved`` (with that answer's ``id``)."""
    frame: dict[str, Any] = {
        "t": "approval_already_resolved" if already else "approval_resolved",
        "approval_id": approval_id,
        "decision": decision,
        "by": by,
    }
    if already:
        frame["id"] = frame_id
    return frame


def watch_result(
    frame_id: object,
    session_id: str,
    events: Sequence[Mapping[str, Any]],
    more: bool,
    before_cursor: str,
    gap: bool,
) -> dict[str, Any]:
    """The first part of a watch's history (``watch_more`` carries the rest)."""
    return {
        "t": "watch_result",
        "id": frame_id,
        "session_id": session_id,
        "events": list(events),
        "more": more,
        "before_cursor": before_cursor,
        "gap": gap,
    }


def watch_more(frame_id: object, events: Sequence[Mapping[str, Any]], more: bool) -> dict[str, Any]:
    return {"t": "watch_more", "id": frame_id, "events": list(events), "more": more}


def watch_message(session_id: str, envelope: Mapping[str, Any]) -> dict[str, Any]:
    """A watched turn's v1 event envelope."""
    return {"t": "watch_message", "session_id": session_id, "message": envelope}


def watch_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """A session event (``event`` names it: ``turn_started``, ``control_changed``, ...)."""
    return {"t": "watch_event", **event}


def overloaded(turn_id: str, after_sequence: int) -> dict[str, Any]:
    return {"t": "overloaded", "turn_id": turn_id, "after_sequence": after_sequence}


# -- daemon frames, as a client reads them -------------------------------------------------


def server_frame_type(frame: Mapping[str, Any]) -> str | None:
    """The type of a frame the daemon sent, or None for a type no daemon sends."""
    kind = frame.get("t")
    return kind if isinstance(kind, str) and kind in SERVER_FRAMES else None


class Refused(_Frozen):
    """A ``refused`` answer to ``hello``; ``code`` is None when it names none."""

    __slots__ = ("code",)
    code: str | None

    def __init__(self, code: str | None) -> None:
        self._set(code)


class Output(_Frozen):
    """Bytes for a shim's stdout. ``seq`` is echoed in ``written`` as sent; ``failures``
    is the raw failed-turn list (the shim bounds what it prints of it); ``answers`` marks
    the output answering a forwarded record."""

    __slots__ = ("data", "seq", "failures", "answers")  # noqa: RUF023
    data: bytes
    seq: object
    failures: object
    answers: bool

    def __init__(self, data: bytes, seq: object, failures: object, answers: bool) -> None:
        self._set(data, seq, failures, answers)


class Next(_Frozen):
    """A forwarded record was handed to a worker: it is answered later."""

    __slots__ = ()


class End(_Frozen):
    """The daemon ends the bridged service; ``detail`` explains an ``output_error``."""

    __slots__ = ("status", "detail")  # noqa: RUF023
    status: str | None
    detail: str | None

    def __init__(self, status: str | None, detail: str | None) -> None:
        self._set(status, detail)


ShimFrame = Output | Next | End


def decode_refused(frame: Mapping[str, Any]) -> Refused | None:
    """The ``refused`` frame as a value, or None for a frame of another type."""
    if server_frame_type(frame) != "refused":
        return None
    code = frame.get("code")
    return Refused(code if isinstance(code, str) else None)


def decode_shim_frame(frame: Mapping[str, Any]) -> ShimFrame | None:
    """A frame a ``v1_shim`` connection receives after ``welcome``, or None for any other
    frame (or an ``output`` without bytes): the shim treats it as a lost connection."""
    match server_frame_type(frame):
        case "output":
            data = frame.get("data")
            if not isinstance(data, bytes):
                return None
            return Output(
                data, frame.get("seq"), frame.get("failures"), frame.get("answers") is True
            )
        case "next":
            return Next()
        case "end":
            status, detail = frame.get("status"), frame.get("detail")
            return End(
                status if isinstance(status, str) else None,
                detail if isinstance(detail, str) else None,
            )
        case _:
            return None


# -- daemon frames, as a persistent client reads them -----------------------------------


class Malformed(Exception):
    """A daemon frame that does not fit its type; ``str(exc)`` says what is wrong. The
    client ends the connection with ``protocol_error``."""


class MessageFrame(_Frozen):
    """A ``message``: a v1 envelope, an event (``event`` and ``payload`` checked) or a
    response (``request_id`` is its ID, None when that is not a string)."""

    __slots__ = ("envelope", "response", "request_id")  # noqa: RUF023
    envelope: dict[str, Any]
    response: bool
    request_id: str | None

    def __init__(self, envelope: dict[str, Any], response: bool, request_id: str | None) -> None:
        self._set(envelope, response, request_id)


class FatalFrame(_Frozen):
    """An ``error``: the daemon ends the connection. ``code`` is ``protocol_error`` when
    the frame names none; ``message`` None when it carries no text."""

    __slots__ = ("code", "message")
    code: str
    message: str | None

    def __init__(self, code: str, message: str | None) -> None:
        self._set(code, message)


class RequestErrorFrame(_Frozen):
    """A ``request_error``: the v1 request ``request_id`` was not run."""

    __slots__ = ("request_id", "code", "message")  # noqa: RUF023
    request_id: str | None
    code: str | None
    message: str | None

    def __init__(self, request_id: str | None, code: str | None, message: str | None) -> None:
        self._set(request_id, code, message)


class OverloadedFrame(_Frozen):
    __slots__ = ("turn_id", "after_sequence")  # noqa: RUF023
    turn_id: str
    after_sequence: int

    def __init__(self, turn_id: str, after_sequence: int) -> None:
        self._set(turn_id, after_sequence)


class ToolDetailFrame(_Frozen):
    """A ``tool_detail``: ``detail`` is ``{"call": {...}}`` or ``{"diff": {...}}``."""

    __slots__ = ("turn_id", "session_id", "activity_id", "detail")  # noqa: RUF023
    turn_id: str
    session_id: str
    activity_id: str
    detail: dict[str, Any]

    def __init__(
        self, turn_id: str, session_id: str, activity_id: str, detail: dict[str, Any]
    ) -> None:
        self._set(turn_id, session_id, activity_id, detail)


class FsRequestFrame(_Frozen):
    """An ``fs_request``: ``content`` is the text of a ``write``, None for a ``read``."""

    __slots__ = ("fs_id", "turn_id", "session_id", "op", "path", "content")  # noqa: RUF023
    fs_id: str
    turn_id: str
    session_id: str
    op: Literal["read", "write"]
    path: str
    content: str | None

    def __init__(
        self,
        fs_id: str,
        turn_id: str,
        session_id: str,
        op: Literal["read", "write"],
        path: str,
        content: str | None,
    ) -> None:
        self._set(fs_id, turn_id, session_id, op, path, content)


class ControlRequestedFrame(_Frozen):
    __slots__ = ("session_id", "by", "timeout_ms")  # noqa: RUF023
    session_id: str
    by: str
    timeout_ms: int

    def __init__(self, session_id: str, by: str, timeout_ms: int) -> None:
        self._set(session_id, by, timeout_ms)


class ControlChangedFrame(_Frozen):
    __slots__ = ("session_id", "controller")  # noqa: RUF023
    session_id: str
    controller: str | None

    def __init__(self, session_id: str, controller: str | None) -> None:
        self._set(session_id, controller)


class ApprovalRequestFrame(_Frozen):
    """An ``approval_request`` (or a watched session's ``approval_requested``)."""

    __slots__ = (  # noqa: RUF023
        "approval_id",
        "turn_id",
        "session_id",
        "kind",
        "summary",
        "options",
        "deadline_ms",
        "activity_id",
    )
    approval_id: str
    turn_id: str
    session_id: str
    kind: str
    summary: dict[str, Any]
    options: tuple[str, ...]
    deadline_ms: int
    activity_id: str | None

    def __init__(
        self,
        approval_id: str,
        turn_id: str,
        session_id: str,
        kind: str,
        summary: dict[str, Any],
        options: tuple[str, ...],
        deadline_ms: int,
        activity_id: str | None,
    ) -> None:
        self._set(
            approval_id, turn_id, session_id, kind, summary, options, deadline_ms, activity_id
        )


class ApprovalResolvedFrame(_Frozen):
    """An ``approval_resolved`` or ``approval_already_resolved``; ``turn_id`` when the
    frame names one (a watched session's always does)."""

    __slots__ = ("approval_id", "decision", "by", "turn_id")  # noqa: RUF023
    approval_id: str
    decision: str
    by: str
    turn_id: str | None

    def __init__(self, approval_id: str, decision: str, by: str, turn_id: str | None) -> None:
        self._set(approval_id, decision, by, turn_id)


class TurnStartedFrame(_Frozen):
    __slots__ = ("session_id", "turn_id", "by", "prompt", "complete")  # noqa: RUF023
    session_id: str
    turn_id: str
    by: str
    prompt: str
    complete: bool

    def __init__(self, session_id: str, turn_id: str, by: str, prompt: str, complete: bool) -> None:
        self._set(session_id, turn_id, by, prompt, complete)


class QueueChangedFrame(_Frozen):
    """A watched session's ``queue_changed`` (§6.12): ``entries`` is the whole queue,
    each a map of the strings ``entry_id``, ``text``, ``by`` and ``added_at``."""

    __slots__ = ("session_id", "entries")  # noqa: RUF023
    session_id: str
    entries: list[dict[str, Any]]

    def __init__(self, session_id: str, entries: list[dict[str, Any]]) -> None:
        self._set(session_id, entries)


class TitleChangedFrame(_Frozen):
    __slots__ = ("session_id", "title")
    session_id: str
    title: str | None

    def __init__(self, session_id: str, title: str | None) -> None:
        self._set(session_id, title)


class RewoundFrame(_Frozen):
    """A watched session was rewound to ``to_cursor`` (§6.16)."""

    __slots__ = ("session_id", "to_cursor")
    session_id: str
    to_cursor: str

    def __init__(self, session_id: str, to_cursor: str) -> None:
        self._set(session_id, to_cursor)


SessionEvent = (
    TurnStartedFrame
    | ControlChangedFrame
    | ControlRequestedFrame
    | ApprovalRequestFrame
    | ApprovalResolvedFrame
    | QueueChangedFrame
    | TitleChangedFrame
    | RewoundFrame
)


class WatchFrame(_Frozen):
    """A ``watch_message`` (``event`` a v1 event envelope), ``watch_event`` (``event`` a
    session event, None for a name this module does not know: a newer daemon's) or
    ``watch_overloaded`` (``event`` None, ``overloaded`` True) of ``session_id``."""

    __slots__ = ("session_id", "event", "overloaded")  # noqa: RUF023
    session_id: str
    event: dict[str, Any] | SessionEvent | None
    overloaded: bool

    def __init__(
        self, session_id: str, event: dict[str, Any] | SessionEvent | None, overloaded: bool
    ) -> None:
        self._set(session_id, event, overloaded)


class CallFailed(_Frozen):
    """A ``*_error`` answering a call; ``code`` None when it names none. ``entry_id``: the
    queue entry a late ``steer_error``'s text became (``turn_finished``, §6.10), else None."""

    __slots__ = ("code", "entry_id")
    code: str | None
    entry_id: str | None

    def __init__(self, code: str | None, entry_id: str | None = None) -> None:
        self._set(code, entry_id)


class Done(_Frozen):
    """An answer with nothing in it: ``steer_result``, ``unwatched``,
    ``control_released``, ``control_answered``."""

    __slots__ = ()


class ControlResult(_Frozen):
    __slots__ = ("result",)
    result: dict[str, Any]

    def __init__(self, result: dict[str, Any]) -> None:
        self._set(result)


class SnapshotResult(_Frozen):
    __slots__ = ("turns", "next_cursor")  # noqa: RUF023
    turns: list[dict[str, Any]]
    next_cursor: str | None

    def __init__(self, turns: list[dict[str, Any]], next_cursor: str | None) -> None:
        self._set(turns, next_cursor)


class AttachPart(_Frozen):
    """``attach_result`` (``status`` one of ``ATTACH_STATUSES``) or ``attach_more``
    (``status`` None)."""

    __slots__ = ("status", "events", "more", "failure")  # noqa: RUF023
    status: str | None
    events: list[dict[str, Any]]
    more: bool
    failure: str | None

    def __init__(
        self, status: str | None, events: list[dict[str, Any]], more: bool, failure: str | None
    ) -> None:
        self._set(status, events, more, failure)


class WatchPart(_Frozen):
    """``watch_result`` (``before_cursor`` and ``gap`` set) or ``watch_more`` (None)."""

    __slots__ = ("session_id", "events", "more", "before_cursor", "gap")  # noqa: RUF023
    session_id: str | None
    events: list[dict[str, Any]]
    more: bool
    before_cursor: str | None
    gap: bool | None

    def __init__(
        self,
        session_id: str | None,
        events: list[dict[str, Any]],
        more: bool,
        before_cursor: str | None,
        gap: bool | None,
    ) -> None:
        self._set(session_id, events, more, before_cursor, gap)


class ControlGrantedResult(_Frozen):
    """``control_granted``; ``session_id`` None when the frame does not repeat it."""

    __slots__ = ("session_id", "turns")
    session_id: str | None
    turns: list[dict[str, Any]]

    def __init__(self, session_id: str | None, turns: list[dict[str, Any]]) -> None:
        self._set(session_id, turns)


class GrantsResult(_Frozen):
    __slots__ = ("session", "project", "project_honoured")  # noqa: RUF023
    session: dict[str, Any] | None
    project: dict[str, Any]
    project_honoured: bool

    def __init__(
        self, session: dict[str, Any] | None, project: dict[str, Any], project_honoured: bool
    ) -> None:
        self._set(session, project, project_honoured)


class PolicyResult(_Frozen):
    __slots__ = ("effective",)
    effective: str | None

    def __init__(self, effective: str | None) -> None:
        self._set(effective)


class SessionsResult(_Frozen):
    __slots__ = ("sessions", "next_cursor", "incomplete")  # noqa: RUF023
    sessions: list[dict[str, Any]]
    next_cursor: str | None
    incomplete: bool

    def __init__(
        self, sessions: list[dict[str, Any]], next_cursor: str | None, incomplete: bool
    ) -> None:
        self._set(sessions, next_cursor, incomplete)


class SessionResult(_Frozen):
    __slots__ = ("session",)
    session: dict[str, Any]

    def __init__(self, session: dict[str, Any]) -> None:
        self._set(session)


class QueueResult(_Frozen):
    """A ``queue_result`` (§6.12): the queue after the call (``entries`` as in
    :class:`QueueChangedFrame`); ``entry_id`` the entry a ``queue_add`` added, else None."""

    __slots__ = ("session_id", "entries", "entry_id")  # noqa: RUF023
    session_id: str | None
    entries: list[dict[str, Any]]
    entry_id: str | None

    def __init__(
        self, session_id: str | None, entries: list[dict[str, Any]], entry_id: str | None
    ) -> None:
        self._set(session_id, entries, entry_id)


class TranscriptResult(_Frozen):
    """``transcript_result`` (§6.14): ``items`` each have a ``kind``; a ``tool_call``
    item's ``turn_id``, ``call_id``, ``call`` (tool, arguments, locations) and ``status``
    (one of ``TRANSCRIPT_CALL_STATUSES``) are checked."""

    __slots__ = ("items", "next_cursor", "gap")  # noqa: RUF023
    items: list[dict[str, Any]]
    next_cursor: str | None
    gap: bool

    def __init__(self, items: list[dict[str, Any]], next_cursor: str | None, gap: bool) -> None:
        self._set(items, next_cursor, gap)


class SelectionResult(_Frozen):
    """``session_selection_result`` (§6.15): ``effective`` has the ``provider_id``,
    ``model_id`` and ``thinking_level`` texts and the ``available_thinking_levels`` list."""

    __slots__ = ("session_id", "effective")  # noqa: RUF023
    session_id: str
    effective: dict[str, Any]

    def __init__(self, session_id: str, effective: dict[str, Any]) -> None:
        self._set(session_id, effective)


class RewindAnswer(_Frozen):
    """``rewind_result`` (§6.16): its fields but ``t`` and ``id``."""

    __slots__ = ("result",)
    result: dict[str, Any]

    def __init__(self, result: dict[str, Any]) -> None:
        self._set(result)


AnswerBody = (
    CallFailed
    | Done
    | ControlResult
    | SnapshotResult
    | AttachPart
    | WatchPart
    | ControlGrantedResult
    | GrantsResult
    | PolicyResult
    | SessionsResult
    | SessionResult
    | QueueResult
    | TranscriptResult
    | SelectionResult
    | RewindAnswer
    | ApprovalResolvedFrame
)


class AnswerFrame(_Frozen):
    """A frame answering the client frame whose ``id`` it carries (None when that is not
    an integer: nobody's)."""

    __slots__ = ("kind", "id", "body")  # noqa: RUF023
    kind: str
    id: int | None
    body: AnswerBody

    def __init__(self, kind: str, frame_id: int | None, body: AnswerBody) -> None:
        self._set(kind, frame_id, body)


PersistentFrame = (
    MessageFrame
    | FatalFrame
    | RequestErrorFrame
    | OverloadedFrame
    | ToolDetailFrame
    | FsRequestFrame
    | ControlRequestedFrame
    | ControlChangedFrame
    | ApprovalRequestFrame
    | ApprovalResolvedFrame
    | WatchFrame
    | AnswerFrame
)

ATTACH_STATUSES: Final = frozenset({"attached", "resync", "finished"})
# Frames only a handshake or a v1 shim connection carries.
_NOT_PERSISTENT: Final = frozenset({"welcome", "refused", "output", "next", "end"})
# A refused call: every per-frame error answer but ``request_error`` (a v1 request's).
_CALL_ERRORS: Final = frozenset(
    kind for kind in SERVER_FRAMES if kind.endswith("_error") and kind != "request_error"
)
_EMPTY_ANSWERS: Final = frozenset(
    {"steer_result", "unwatched", "control_released", "control_answered"}
)


def decode_persistent_frame(frame: Mapping[str, Any]) -> PersistentFrame | None:
    """A frame a ``persistent`` or ``control`` connection receives after ``welcome``, as a
    value; None for a type no daemon sends.

    Raises:
        Malformed: the frame does not fit its type, or belongs to another connection.
    """
    kind = server_frame_type(frame)
    if kind is None:
        return None
    if kind in _NOT_PERSISTENT:
        raise Malformed(f"{kind!r} frame on an open connection")
    match kind:
        case "message":
            return _message_frame(frame.get("message"))
        case "error":
            code, message = frame.get("code"), frame.get("message")
            return FatalFrame(
                code if isinstance(code, str) else Code.PROTOCOL_ERROR.value,
                message if isinstance(message, str) and message else None,
            )
        case "request_error":
            rid, code, message = frame.get("request_id"), frame.get("code"), frame.get("message")
            return RequestErrorFrame(
                rid if isinstance(rid, str) else None,
                code if isinstance(code, str) else None,
                message if isinstance(message, str) and message else None,
            )
        case "overloaded":
            turn_id, after = frame.get("turn_id"), frame.get("after_sequence")
            if not isinstance(turn_id, str) or not _is_int(after):
                raise Malformed("overloaded without turn_id and after_sequence")
            return OverloadedFrame(turn_id, after)
        case "tool_detail":
            return _tool_detail(frame)
        case "fs_request":
            return _fs_request(frame)
        case "control_requested":
            return _control_requested(frame)
        case "control_changed":
            return _control_changed(frame)
        case "approval_request":
            return _approval_request(frame, "approval_request")
        case "approval_resolved":
            return _approval_resolved(frame, "approval_resolved")
        case "watch_message" | "watch_event" | "watch_overloaded":
            return _watch_frame(kind, frame)
        case _:
            frame_id = frame.get("id")
            return AnswerFrame(kind, frame_id if _is_int(frame_id) else None, _answer(kind, frame))


def _message_frame(message: object) -> MessageFrame:
    if not isinstance(message, dict):
        raise Malformed("a message frame without a v1 envelope")
    match message.get("kind"):
        case "event":
            if not isinstance(message.get("event"), str) or not isinstance(
                message.get("payload"), dict
            ):
                raise Malformed("an event envelope without event and payload")
            return MessageFrame(message, False, None)
        case "response":
            rid = message.get("request_id")
            return MessageFrame(message, True, rid if isinstance(rid, str) else None)
        case _:
            raise Malformed("a v1 envelope that is neither response nor event")


def _texts(frame: Mapping[str, Any], kind: str, *names: str) -> list[str]:
    values = [frame.get(name) for name in names]
    if not all(isinstance(value, str) for value in values):
        raise Malformed(f"an invalid {kind}")
    return cast(list[str], values)


def _tool_detail(frame: Mapping[str, Any]) -> ToolDetailFrame:
    ids = [frame.get(key) for key in ("turn_id", "session_id", "activity_id")]
    detail = {key: frame[key] for key in ("call", "diff") if isinstance(frame.get(key), dict)}
    if not all(isinstance(value, str) for value in ids) or len(detail) != 1:
        raise Malformed("tool_detail without its IDs and one detail")
    turn_id, session_id, activity_id = cast(list[str], ids)
    return ToolDetailFrame(turn_id, session_id, activity_id, detail)


def _fs_request(frame: Mapping[str, Any]) -> FsRequestFrame:
    ids = [frame.get(key) for key in ("fs_id", "turn_id", "session_id")]
    op, path, content = frame.get("op"), frame.get("path"), frame.get("content")
    if (
        not all(isinstance(value, str) for value in ids)
        or op not in EDITOR_FILE_OPS
        or not isinstance(path, str)
        or not isinstance(content, str | None)
        or (op == "write") != isinstance(content, str)
    ):
        raise Malformed("an invalid fs_request")
    fs_id, turn_id, session_id = cast(list[str], ids)
    return FsRequestFrame(fs_id, turn_id, session_id, op, path, content)


def _session_of(kind: str, frame: Mapping[str, Any]) -> str:
    session_id = frame.get("session_id")
    if not isinstance(session_id, str):
        raise Malformed(f"{kind} without a session ID")
    return session_id


def _control_requested(frame: Mapping[str, Any]) -> ControlRequestedFrame:
    by, timeout_ms = frame.get("by"), frame.get("timeout_ms")
    if not isinstance(by, str) or not _is_int(timeout_ms):
        raise Malformed("an invalid control_requested")
    return ControlRequestedFrame(_session_of("control_requested", frame), by, timeout_ms)


def _control_changed(frame: Mapping[str, Any]) -> ControlChangedFrame:
    controller = frame.get("controller")
    if not isinstance(controller, str | None):
        raise Malformed("an invalid control_changed")
    return ControlChangedFrame(_session_of("control_changed", frame), controller)


def _approval_request(frame: Mapping[str, Any], kind: str) -> ApprovalRequestFrame:
    fields = [frame.get(k) for k in ("approval_id", "turn_id", "session_id", "kind")]
    summary, options, deadline = (
        frame.get("summary"),
        frame.get("options"),
        frame.get("deadline_ms"),
    )
    if (
        not all(isinstance(f, str) for f in fields)
        or not isinstance(summary, dict)
        or not isinstance(options, list)
        or not all(isinstance(o, str) for o in options)
        or not _is_int(deadline)
    ):
        raise Malformed(f"an invalid {kind}")
    approval_id, turn_id, session_id, approval_kind = cast(list[str], fields)
    activity_id = frame.get("activity_id")
    return ApprovalRequestFrame(
        approval_id,
        turn_id,
        session_id,
        approval_kind,
        summary,
        tuple(options),
        deadline,
        activity_id if isinstance(activity_id, str) else None,
    )


def _approval_resolved(frame: Mapping[str, Any], kind: str) -> ApprovalResolvedFrame:
    approval_id, decision, by = _texts(frame, kind, "approval_id", "decision", "by")
    turn_id = frame.get("turn_id")
    return ApprovalResolvedFrame(
        approval_id, decision, by, turn_id if isinstance(turn_id, str) else None
    )


def _watch_frame(kind: str, frame: Mapping[str, Any]) -> WatchFrame:
    session_id = _session_of(kind, frame)
    if kind == "watch_overloaded":
        return WatchFrame(session_id, None, True)
    if kind == "watch_message":
        message = frame.get("message")
        if not (
            isinstance(message, dict)
            and message.get("kind") == "event"
            and isinstance(message.get("event"), str)
            and isinstance(message.get("payload"), dict)
        ):
            raise Malformed("a watch_message without a v1 event envelope")
        return WatchFrame(session_id, message, False)
    event: SessionEvent | None
    match frame.get("event"):
        case "turn_started":
            turn_id, by, prompt = _texts(frame, "turn_started", "turn_id", "by", "prompt")
            complete = frame.get("complete", True)
            if not isinstance(complete, bool):
                raise Malformed("an invalid turn_started")
            event = TurnStartedFrame(session_id, turn_id, by, prompt, complete)
        case "control_changed":
            event = _control_changed(frame)
        case "control_requested":
            event = _control_requested(frame)
        case "approval_requested":
            event = _approval_request(frame, "approval_requested")
        case "approval_resolved":
            event = _approval_resolved(frame, "approval_resolved")
            if event.turn_id is None:
                raise Malformed("an invalid approval_resolved")
        case "queue_changed":
            entries = frame.get("entries")
            if not _queue_entries(entries):
                raise Malformed("an invalid queue_changed")
            event = QueueChangedFrame(session_id, entries)
        case "title_changed":
            title = frame.get("title")
            if not isinstance(title, str | None):
                raise Malformed("an invalid title_changed")
            event = TitleChangedFrame(session_id, title)
        case "rewound":
            (to_cursor,) = _texts(frame, "rewound", "to_cursor")
            event = RewoundFrame(session_id, to_cursor)
        case str():
            event = None  # a session event this module does not know (a newer daemon's)
        case _:
            raise Malformed("a watch_event without an event name")
    return WatchFrame(session_id, event, False)


def _dicts(value: object) -> TypeGuard[list[dict[str, Any]]]:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _queue_entries(value: object) -> TypeGuard[list[dict[str, Any]]]:
    return _dicts(value) and all(
        isinstance(entry.get(name), str)
        for entry in value
        for name in ("entry_id", "text", "by", "added_at")
    )


def _answer(kind: str, frame: Mapping[str, Any]) -> AnswerBody:
    if kind in _CALL_ERRORS:
        code = frame.get("code")
        entry_id = frame.get("entry_id") if kind == "steer_error" else None
        if not isinstance(entry_id, str | None):
            raise Malformed("steer_error with an invalid entry_id")
        return CallFailed(code if isinstance(code, str) else None, entry_id)
    if kind in _EMPTY_ANSWERS:
        return Done()
    match kind:
        case "control_result":
            result = frame.get("result")
            if not isinstance(result, dict):
                raise Malformed("control_result without a result map")
            return ControlResult(result)
        case "snapshot_result":
            turns, cursor = frame.get("turns"), frame.get("next_cursor")
            if not _dicts(turns):
                raise Malformed("snapshot_result without a turn list")
            if not isinstance(cursor, str | None):
                raise Malformed("snapshot_result with an invalid cursor")
            return SnapshotResult(turns, cursor)
        case "attach_result" | "attach_more" | "watch_result" | "watch_more":
            return _part(kind, frame)
        case "control_granted":
            turns, session_id = frame.get("turns"), frame.get("session_id")
            if not _dicts(turns):
                raise Malformed("control_granted without a turn list")
            if not isinstance(session_id, str | None):
                raise Malformed("control_granted with an invalid session ID")
            return ControlGrantedResult(session_id, turns)
        case "grants_result":
            session, project = frame.get("session"), frame.get("project")
            honoured = frame.get("project_honoured")
            if not isinstance(project, dict) or not isinstance(honoured, bool):
                raise Malformed("grants_result without project grants")
            if not isinstance(session, dict | None):
                raise Malformed("grants_result with invalid session grants")
            return GrantsResult(session, project, honoured)
        case "approval_policy_result":
            effective = frame.get("effective")
            return PolicyResult(effective if isinstance(effective, str) else None)
        case "sessions_result":
            sessions, cursor = frame.get("sessions"), frame.get("next_cursor")
            if not _dicts(sessions):
                raise Malformed("sessions_result without a session list")
            if not isinstance(cursor, str | None):
                raise Malformed("sessions_result with an invalid cursor")
            return SessionsResult(sessions, cursor, frame.get("incomplete") is True)
        case "session_result":
            session = frame.get("session")
            if not isinstance(session, dict):
                raise Malformed("session_result without a session")
            return SessionResult(session)
        case "queue_result":
            entries, session_id = frame.get("entries"), frame.get("session_id")
            entry_id = frame.get("entry_id")
            if not _queue_entries(entries):
                raise Malformed("queue_result without a queue")
            if not isinstance(session_id, str | None) or not isinstance(entry_id, str | None):
                raise Malformed("an invalid queue_result")
            return QueueResult(session_id, entries, entry_id)
        case "transcript_result":
            return _transcript_result(frame)
        case "session_selection_result":
            return _selection_result(frame)
        case "rewind_result":
            files, messages = frame.get("files"), frame.get("messages")
            if not _dicts(files) or not _dicts(messages):
                raise Malformed("rewind_result without files or messages")
            return RewindAnswer({k: v for k, v in frame.items() if k not in ("t", "id")})
        case "approval_already_resolved":
            return _approval_resolved(frame, kind)
        case _:  # a server frame type this decoder does not know: a bug in this module
            raise Malformed(f"{kind!r} is not an answer")


def _transcript_result(frame: Mapping[str, Any]) -> TranscriptResult:
    items, cursor, gap = frame.get("items"), frame.get("next_cursor"), frame.get("gap")
    if not _dicts(items) or not all(_transcript_item(item) for item in items):
        raise Malformed("transcript_result without its items")
    if not isinstance(cursor, str | None) or not isinstance(gap, bool):
        raise Malformed("transcript_result with an invalid cursor or gap")
    return TranscriptResult(items, cursor, gap)


def _transcript_item(item: Mapping[str, Any]) -> bool:
    kind = item.get("kind")
    if kind != "tool_call":
        return isinstance(kind, str)
    call = item.get("call")
    return (
        isinstance(item.get("turn_id"), str)
        and isinstance(item.get("call_id"), str)
        and item.get("status") in TRANSCRIPT_CALL_STATUSES
        and isinstance(call, dict)
        and isinstance(call.get("tool"), str)
        and isinstance(call.get("arguments"), dict)
        and _dicts(call.get("locations"))
    )


def _selection_result(frame: Mapping[str, Any]) -> SelectionResult:
    effective = frame.get("effective")
    if not isinstance(effective, dict):
        raise Malformed("session_selection_result without effective")
    _texts(effective, "session_selection_result", "provider_id", "model_id", "thinking_level")
    levels = effective.get("available_thinking_levels")
    if not isinstance(levels, list) or not all(isinstance(level, str) for level in levels):
        raise Malformed("an invalid session_selection_result")
    return SelectionResult(_session_of("session_selection_result", frame), effective)


def _part(kind: str, frame: Mapping[str, Any]) -> AttachPart | WatchPart:
    events, more = frame.get("events"), frame.get("more", False)
    if not _dicts(events):
        raise Malformed(f"{kind} without an event list")
    if not isinstance(more, bool):
        raise Malformed(f"{kind} with an invalid 'more'")
    if kind == "attach_more":
        return AttachPart(None, events, more, None)
    if kind == "watch_more":
        return WatchPart(None, events, more, None, None)
    if kind == "attach_result":
        status, failure = frame.get("status"), frame.get("failure")
        if status not in ATTACH_STATUSES:
            raise Malformed(f"an unexpected {kind}")
        return AttachPart(status, events, more, failure if isinstance(failure, str) else None)
    session_id, before, gap = frame.get("session_id"), frame.get("before_cursor"), frame.get("gap")
    if not isinstance(before, str) or not isinstance(gap, bool):
        raise Malformed("watch_result without before_cursor and gap")
    return WatchPart(session_id if isinstance(session_id, str) else None, events, more, before, gap)
