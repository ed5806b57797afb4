"""The v2 frames of watching (RFC-0002 §6.9), control hand-over (§6.1), steering (§6.10),
the session library (§6.11) and the prompt queue (§6.12) as shapes, and their JSON Schema
documents (strict: exactly what this version sends and accepts).

Values come from the frames' one declaration (``protocol.v2``); bounds owned by the layers
above name their source (``Shape.sources``), which a test resolves. Documents, by name:
``v2.<frame type>`` for every frame in ``GROUPS``; ``v2.watch_event`` checks each session
event by its ``event`` (the approval events with the approval frames' shapes, §6.7);
``v2.<group>`` (``watching``, ``handover``, ``steering``, ``library``, ``queue``), any
frame of that group (every document of it in its ``$defs``).
"""

from __future__ import annotations

from typing import Any, Final

from magi_code.protocol import v2
from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.limits import (
    MAX_ID_BYTES,
    MAX_SESSION_PAGE_ITEMS,
    MAX_STRING_BYTES,
)

from . import approvals
from .model import Arr, Bool, Field, Int, Nullable, Obj, Shape, Str, to_schema

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX: Final = "urn:magi-code:protocol:v2"

_ID: Final = Str(min_length=1, max_bytes=MAX_ID_BYTES, printable=True)
_FRAME_ID: Final = Int(minimum=0, doc="The frame's id, as the client sent it.")
_ERROR_ID: Final = Nullable(inner=_FRAME_ID, doc="null: the refused frame had no valid id.")
_CURSOR: Final = Str(min_length=1, max_bytes=v2.MAX_CURSOR_BYTES, printable=True)
LABEL: Final = Str(
    min_length=1,
    max_bytes=MAX_ID_BYTES,
    printable=True,
    doc="A connection's <client_name>#<n> (queue#<n>: a queue runner).",
)
PROMPT: Final = Str(
    min_length=1,
    non_blank=True,
    max_bytes=MAX_STRING_BYTES,
    doc="With non-whitespace content (the v1 bound of a prompt).",
)
_RFC3339: Final = Str(min_length=1, format="date-time")


def _t(kind: str) -> Field:
    return Field(name="t", shape=Str(const=kind))


def _id(doc: str = "") -> Field:
    return Field(name="id", shape=_FRAME_ID, doc=doc)


def _session() -> Field:
    return Field(name="session_id", shape=_ID)


def _codes(*codes: str) -> Field:
    return Field(name="code", shape=Str(enum=codes))


def _error(kind: str, doc: str, *codes: str) -> Obj:
    return Obj(doc=doc, fields=(_t(kind), Field(name="id", shape=_ERROR_ID), _codes(*codes)))


# The v1 codes these answers carry too (the service's errors, e.g. of a session's lease);
# unsupported_operation: a daemon without that part (its store could not start).
_INVALID_SESSION_ID: Final = ErrorCode.INVALID_SESSION_ID.value
_SESSION_UNAVAILABLE: Final = ErrorCode.SESSION_UNAVAILABLE.value
_LIMIT_EXCEEDED: Final = ErrorCode.LIMIT_EXCEEDED.value
_NOT_INITIALIZED: Final = ErrorCode.NOT_INITIALIZED.value
_UNSUPPORTED: Final = ErrorCode.UNSUPPORTED_OPERATION.value
_C = v2.Code

# -- watching (§6.9) ------------------------------------------------------------------------

_HISTORY_ITEMS: Final = Arr(
    items=Obj(closed=False),
    max_items=1024,
    sources={"max_items": "magi_code.core.watch:MAX_WATCH_HISTORY_ITEMS"},
)
WATCH: Final = Obj(
    doc="client → daemon: watch a session (history after after_cursor, then live).",
    fields=(
        _t("watch"),
        _id("Echoed in watch_result, watch_more or watch_error."),
        _session(),
        Field(name="after_cursor", shape=_CURSOR, required=False),
    ),
)
UNWATCH: Final = Obj(
    doc="client → daemon: stop watching.",
    fields=(_t("unwatch"), _id(), _session()),
)
WATCH_RESULT: Final = Obj(
    doc="daemon → client: the first part of the watch's history.",
    fields=(
        _t("watch_result"),
        _id(),
        _session(),
        Field(
            name="events",
            shape=_HISTORY_ITEMS,
            doc="session.replay items and approval items (v2.history.approval).",
        ),
        Field(name="more", shape=Bool(), doc="watch_more parts follow."),
        Field(name="before_cursor", shape=_CURSOR),
        Field(name="gap", shape=Bool()),
    ),
)
WATCH_MORE: Final = Obj(
    doc="daemon → client: a further part of the watch's history.",
    fields=(
        _t("watch_more"),
        _id(),
        Field(name="events", shape=_HISTORY_ITEMS),
        Field(name="more", shape=Bool()),
    ),
)
WATCH_ERROR: Final = _error(
    "watch_error",
    "daemon → client: a watch or unwatch was refused.",
    _C.INVALID_REQUEST.value,
    _C.RESYNC_REQUIRED.value,
    _LIMIT_EXCEEDED,
    _INVALID_SESSION_ID,
    _SESSION_UNAVAILABLE,
    _UNSUPPORTED,
)
UNWATCHED: Final = Obj(
    doc="daemon → client: the session is not watched (any more).",
    fields=(_t("unwatched"), _id(), _session()),
)
WATCH_MESSAGE: Final = Obj(
    doc="daemon → client: a watched turn's v1 event envelope.",
    fields=(
        _t("watch_message"),
        _session(),
        Field(name="message", shape=Obj(closed=False), doc="A v1 event record (envelope.event)."),
    ),
)
WATCH_OVERLOADED: Final = Obj(
    doc="daemon → client: the watch ended at the outbound limit (watch again).",
    fields=(_t("watch_overloaded"), _session()),
)


def _event(name: str, doc: str, *fields: Field) -> Obj:
    return Obj(
        doc=doc,
        fields=(
            _t("watch_event"),
            Field(name="event", shape=Str(const=name)),
            _session(),
            *fields,
        ),
    )


_QUEUE_ENTRY: Final = Obj(
    fields=(
        Field(
            name="entry_id",
            shape=Str(pattern=r"^q_[0-9a-f]{16}$", example="q_0123456789abcdef"),
        ),
        Field(name="text", shape=PROMPT),
        Field(name="by", shape=LABEL, doc="The connection that queued it."),
        Field(name="added_at", shape=_RFC3339),
    ),
)
QUEUE_ENTRIES: Final = Arr(
    items=_QUEUE_ENTRY,
    max_items=32,
    sources={"max_items": "magi_code.sessions.queue:MAX_QUEUE_ENTRIES"},
    doc="The whole queue, in the order the entries run.",
)
_TITLE: Final = Nullable(
    inner=Str(
        max_length=80,
        sources={"max_length": "magi_code.sessions.titles:MAX_TITLE_CHARS"},
    ),
    doc="Sanitized, or null.",
)


def _approval_event(name: str, frame: Obj, *extra: Field) -> Obj:
    """A watch event with an approval frame's members (§6.7), ``extra`` after them."""
    kept = tuple(f for f in frame.fields if f.name not in ("t", "session_id"))
    return _event(name, f"An approval frame's members ({frame.doc})", *kept, *extra)


EVENTS: Final[dict[str, Obj]] = {
    "turn_started": _event(
        "turn_started",
        "A turn of the session started (its events follow as watch_message).",
        Field(name="turn_id", shape=_ID),
        Field(name="by", shape=LABEL, doc="The starting connection."),
        Field(name="prompt", shape=Str(max_bytes=MAX_STRING_BYTES)),
        Field(
            name="complete",
            shape=Bool(),
            required=False,
            default="true",
            doc="false: the turn's earliest buffered events were evicted.",
        ),
    ),
    "control_changed": _event(
        "control_changed",
        "The session's controller changed.",
        Field(name="controller", shape=Nullable(inner=LABEL), doc="null: nobody."),
    ),
    "control_requested": _event(
        "control_requested",
        "A connection asked the controller for control.",
        Field(name="by", shape=LABEL),
        Field(name="timeout_ms", shape=Int(minimum=0)),
    ),
    "approval_requested": _approval_event("approval_requested", approvals.APPROVAL_REQUEST),
    "approval_resolved": _approval_event(
        "approval_resolved", approvals.APPROVAL_RESOLVED, Field(name="turn_id", shape=_ID)
    ),
    "queue_changed": _event(
        "queue_changed",
        "The session's prompt queue after a change (§6.12).",
        Field(name="entries", shape=QUEUE_ENTRIES),
    ),
    "title_changed": _event(
        "title_changed",
        "A session_rename stored a title (§6.11).",
        Field(name="title", shape=_TITLE),
    ),
    "rewound": _event(
        "rewound",
        "The session was rewound (§6.16).",
        Field(name="to_cursor", shape=_CURSOR),
    ),
}

# -- control hand-over (§6.1) ---------------------------------------------------------------

_GRANT_CODES: Final = (
    _C.INVALID_REQUEST.value,
    _C.SESSION_BUSY.value,
    _C.CONTROL_REFUSED.value,
    _NOT_INITIALIZED,
    _INVALID_SESSION_ID,
    _SESSION_UNAVAILABLE,
    _LIMIT_EXCEEDED,
    _UNSUPPORTED,
)
_RUNNING_TURN: Final = Obj(
    fields=(
        Field(name="turn_id", shape=_ID),
        Field(name="sequence", shape=Int(minimum=0), doc="The last sequence recorded."),
    ),
)
CONTROL_GRANTED: Final = Obj(
    doc="daemon → client: the caller controls the session (take_control, control_request).",
    fields=(
        _t("control_granted"),
        _id(),
        _session(),
        Field(
            name="turns",
            shape=Arr(items=_RUNNING_TURN),
            doc="The session's running turns (follow them with attach).",
        ),
    ),
)
GRANT_ERROR: Final = _error(
    "grant_error",
    "daemon → client: take_control, control_release, control_request or control_answer "
    "was refused.",
    *_GRANT_CODES,
)
CONTROL_RELEASE: Final = Obj(
    doc="client → daemon: give up control of the session.",
    fields=(_t("control_release"), _id("Echoed in control_released or grant_error."), _session()),
)
CONTROL_RELEASED: Final = Obj(
    doc="daemon → client: the caller does not hold the session (any more).",
    fields=(_t("control_released"), _id(), _session()),
)
CONTROL_REQUEST: Final = Obj(
    doc="client → daemon: ask for control (the controller may be asked).",
    fields=(_t("control_request"), _id("Echoed in control_granted or grant_error."), _session()),
)
CONTROL_REQUESTED: Final = Obj(
    doc="daemon → controller: a connection asks for control of its session.",
    fields=(
        _t("control_requested"),
        _session(),
        Field(name="by", shape=LABEL),
        Field(name="timeout_ms", shape=Int(minimum=0), doc="Granted after it if unanswered."),
    ),
)
CONTROL_ANSWER: Final = Obj(
    doc="controller → daemon: grant or refuse a waiting control_request.",
    fields=(
        _t("control_answer"),
        _id("Echoed in control_answered or grant_error."),
        _session(),
        Field(name="grant", shape=Bool()),
    ),
)
CONTROL_ANSWERED: Final = Obj(
    doc="daemon → controller: its control_answer was taken.",
    fields=(_t("control_answered"), _id(), _session()),
)
CONTROL_CHANGED: Final = Obj(
    doc="daemon → old controller: control of its session moved.",
    fields=(_t("control_changed"), _session(), Field(name="controller", shape=LABEL)),
)

# -- steering (§6.10) ------------------------------------------------------------------------

STEER: Final = Obj(
    doc="client → daemon: text into a running turn of a session the caller controls.",
    fields=(
        _t("steer"),
        _id("Echoed in steer_result or steer_error."),
        Field(name="turn_id", shape=_ID),
        Field(name="text", shape=PROMPT),
    ),
)
STEER_RESULT: Final = Obj(
    doc="daemon → client: the text entered the turn (at its request boundary).",
    fields=(_t("steer_result"), _id(), Field(name="turn_id", shape=_ID)),
)
STEER_ERROR: Final = Obj(
    doc="daemon → client: the steer was refused, or came too late.",
    fields=(
        _t("steer_error"),
        Field(name="id", shape=_ERROR_ID),
        _codes(
            _C.TURN_FINISHED.value,
            _C.UNKNOWN_TURN.value,
            _C.INVALID_REQUEST.value,
            _UNSUPPORTED,
        ),
        Field(
            name="entry_id",
            shape=_QUEUE_ENTRY.fields[0].shape,
            required=False,
            doc="turn_finished only: the queue entry the text became (absent: not queued).",
        ),
    ),
)

# -- the session library (§6.11) ---------------------------------------------------------

_LIBRARY_ITEM: Final = Obj(
    fields=(
        _session(),
        Field(name="title", shape=_TITLE),
        Field(name="updated_at", shape=_RFC3339, doc="The last activity."),
        Field(
            name="project_dir",
            shape=Nullable(inner=Str(min_length=1, max_bytes=v2.MAX_PATH_BYTES)),
            doc="The creating connection's launch project (null: not recorded).",
        ),
        Field(name="archived", shape=Bool()),
        Field(
            name="forked_from",
            shape=Obj(fields=(_session(), Field(name="at_cursor", shape=_CURSOR))),
            required=False,
            doc="A fork's origin (§6.16).",
        ),
        Field(
            name="forks",
            shape=Arr(items=_ID, min_items=1),
            required=False,
            doc="The sessions forked from this one (§6.16).",
        ),
    ),
)
_TITLE_TEXT: Final = Str(min_length=1, max_length=v2.MAX_TITLE_FILTER)
SESSIONS_LIST: Final = Obj(
    doc="client → daemon: a page of the session library.",
    fields=(
        _t("sessions_list"),
        _id("Echoed in sessions_result or session_error."),
        Field(
            name="project_dir",
            shape=Str(min_length=1, max_bytes=v2.MAX_PATH_BYTES),
            required=False,
            doc="Absolute: sessions created in this project.",
        ),
        Field(
            name="title",
            shape=_TITLE_TEXT,
            required=False,
            doc="The title contains it (any case).",
        ),
        Field(
            name="archived",
            shape=Bool(),  # or "all": ``_sessions_list_schema`` widens it
            required=False,
            default="false",
        ),
        Field(name="cursor", shape=_CURSOR, required=False, doc="The previous next_cursor."),
        Field(
            name="limit",
            shape=Int(minimum=1, maximum=MAX_SESSION_PAGE_ITEMS),
            required=False,
            default=str(MAX_SESSION_PAGE_ITEMS),
        ),
    ),
)
SESSIONS_RESULT: Final = Obj(
    doc="daemon → client: a page of the library, most recent activity first.",
    fields=(
        _t("sessions_result"),
        _id(),
        Field(
            name="sessions",
            shape=Arr(items=_LIBRARY_ITEM, max_items=MAX_SESSION_PAGE_ITEMS),
        ),
        Field(name="next_cursor", shape=Nullable(inner=_CURSOR), doc="null: the last page."),
        Field(name="incomplete", shape=Bool(), doc="The scan budget ran out or a session failed."),
    ),
)
SESSION_RENAME: Final = Obj(
    doc="client → daemon: store an explicit title.",
    fields=(
        _t("session_rename"),
        _id("Echoed in session_result or session_error."),
        _session(),
        Field(name="title", shape=_TITLE_TEXT),
    ),
)
SESSION_ARCHIVE: Final = Obj(
    doc="client → daemon: hide the session from the default lists.",
    fields=(_t("session_archive"), _id(), _session()),
)
SESSION_UNARCHIVE: Final = Obj(
    doc="client → daemon: show the session again.",
    fields=(_t("session_unarchive"), _id(), _session()),
)
SESSION_RESULT: Final = Obj(
    doc="daemon → client: the session's library item after the change (or a fork's).",
    fields=(_t("session_result"), _id(), Field(name="session", shape=_LIBRARY_ITEM)),
)
SESSION_ERROR: Final = _error(
    "session_error",
    "daemon → client: a library, transcript, fork or rewind frame was refused.",
    _C.INVALID_REQUEST.value,
    _C.RESYNC_REQUIRED.value,
    _C.NOT_TURN_BOUNDARY.value,
    _C.TURN_RUNNING.value,
    _INVALID_SESSION_ID,
    _SESSION_UNAVAILABLE,
    _C.SESSION_BUSY.value,
    _UNSUPPORTED,
)

# -- the prompt queue (§6.12) -------------------------------------------------------------

_ENTRY_ID: Final = Field(name="entry_id", shape=_ID)
QUEUE_ADD: Final = Obj(
    doc="client → daemon: add a prompt at the tail.",
    fields=(_t("queue_add"), _id(), _session(), Field(name="text", shape=PROMPT)),
)
QUEUE_LIST: Final = Obj(
    doc="client → daemon: the queue.",
    fields=(_t("queue_list"), _id(), _session()),
)
QUEUE_REMOVE: Final = Obj(
    doc="client → daemon: remove an entry.",
    fields=(_t("queue_remove"), _id(), _session(), _ENTRY_ID),
)
QUEUE_MOVE: Final = Obj(
    doc="client → daemon: move an entry (0: the head; past the tail: the tail).",
    fields=(
        _t("queue_move"),
        _id(),
        _session(),
        _ENTRY_ID,
        Field(name="index", shape=Int(minimum=0, maximum=v2.MAX_QUEUE_INDEX)),
    ),
)
QUEUE_SEND_NOW: Final = Obj(
    doc="client → daemon: steer the entry into the running turn, or run it now.",
    fields=(_t("queue_send_now"), _id(), _session(), _ENTRY_ID),
)
QUEUE_RESULT: Final = Obj(
    doc="daemon → client: the whole queue after the frame's change.",
    fields=(
        _t("queue_result"),
        _id(),
        _session(),
        Field(name="entries", shape=QUEUE_ENTRIES),
        Field(
            name="entry_id",
            shape=_QUEUE_ENTRY.fields[0].shape,
            required=False,
            doc="queue_add only: the new entry.",
        ),
    ),
)
QUEUE_ERROR: Final = _error(
    "queue_error",
    "daemon → client: a queue frame was refused.",
    _C.INVALID_REQUEST.value,
    _C.NOT_CONTROLLER.value,
    _C.UNKNOWN_ENTRY.value,
    _LIMIT_EXCEEDED,
    _C.TURN_FINISHED.value,
    _INVALID_SESSION_ID,
    _SESSION_UNAVAILABLE,
    _C.SESSION_BUSY.value,
    _UNSUPPORTED,
)

# Every frame by group (a group's bundle is ``v2.<group>``); ``watch_event`` is a document
# of its own (see ``_watch_event_schema``).
GROUPS: Final[dict[str, dict[str, Obj]]] = {
    "watching": {
        "watch": WATCH,
        "unwatch": UNWATCH,
        "watch_result": WATCH_RESULT,
        "watch_more": WATCH_MORE,
        "watch_error": WATCH_ERROR,
        "unwatched": UNWATCHED,
        "watch_message": WATCH_MESSAGE,
        "watch_overloaded": WATCH_OVERLOADED,
    },
    "handover": {
        "control_release": CONTROL_RELEASE,
        "control_released": CONTROL_RELEASED,
        "control_request": CONTROL_REQUEST,
        "control_requested": CONTROL_REQUESTED,
        "control_answer": CONTROL_ANSWER,
        "control_answered": CONTROL_ANSWERED,
        "control_changed": CONTROL_CHANGED,
        "control_granted": CONTROL_GRANTED,
        "grant_error": GRANT_ERROR,
    },
    "steering": {"steer": STEER, "steer_result": STEER_RESULT, "steer_error": STEER_ERROR},
    "library": {
        "sessions_list": SESSIONS_LIST,
        "sessions_result": SESSIONS_RESULT,
        "session_rename": SESSION_RENAME,
        "session_archive": SESSION_ARCHIVE,
        "session_unarchive": SESSION_UNARCHIVE,
        "session_result": SESSION_RESULT,
        "session_error": SESSION_ERROR,
    },
    "queue": {
        "queue_add": QUEUE_ADD,
        "queue_list": QUEUE_LIST,
        "queue_remove": QUEUE_REMOVE,
        "queue_move": QUEUE_MOVE,
        "queue_send_now": QUEUE_SEND_NOW,
        "queue_result": QUEUE_RESULT,
        "queue_error": QUEUE_ERROR,
    },
}
FRAMES: Final[dict[str, Obj]] = {
    kind: shape for group in GROUPS.values() for kind, shape in group.items()
}
# The frame types a document here checks (``watch_event`` by its event).
FRAME_TYPES: Final = frozenset({*FRAMES, "watch_event"})
# Which bundle holds each frame type.
BUNDLES: Final[dict[str, str]] = {
    **{kind: f"v2.{group}" for group, frames in GROUPS.items() for kind in frames},
    "watch_event": "v2.watching",
}


def shapes() -> dict[str, Shape]:
    """Every shape declared here, by document name."""
    named: dict[str, Shape] = {f"v2.{kind}": shape for kind, shape in FRAMES.items()}
    named.update({f"v2.watch_event.{name}": shape for name, shape in EVENTS.items()})
    named["v2.queue.entry"] = _QUEUE_ENTRY
    named["v2.library.item"] = _LIBRARY_ITEM
    return named


def _sessions_list_schema() -> dict[str, Any]:
    """``sessions_list`` with ``archived``: a boolean or ``"all"``."""
    schema = to_schema(SESSIONS_LIST, "strict", 1)
    schema["properties"]["archived"] = {
        "description": "false (the default): not archived; true: archived only; all: both.",
        "anyOf": [{"type": "boolean"}, {"const": "all"}],
    }
    return schema


def _watch_event_schema() -> dict[str, Any]:
    """``watch_event``: one of the session events, chosen by ``event``."""
    events = {}
    for name, shape in EVENTS.items():
        body = to_schema(shape, "strict", 1)
        if name == "approval_requested":
            body["allOf"] = [
                {
                    "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                    "then": {"properties": {"summary": to_schema(summary, "strict", 2)}},
                }
                for kind, summary in approvals.SUMMARIES.items()
            ]
        events[name] = body
    return {
        "description": "daemon → client: a session event (a client ignores a name it does not "
        "know; this version sends these).",
        "type": "object",
        "required": ["t", "event"],
        "properties": {"t": {"const": "watch_event"}, "event": {"enum": list(EVENTS)}},
        "allOf": [
            {
                "if": {"properties": {"event": {"const": name}}, "required": ["event"]},
                "then": body,
            }
            for name, body in events.items()
        ],
    }


def _bodies() -> dict[str, dict[str, Any]]:
    bodies = {f"v2.{kind}": to_schema(shape, "strict", 1) for kind, shape in FRAMES.items()}
    bodies["v2.sessions_list"] = _sessions_list_schema()
    bodies["v2.watch_event"] = _watch_event_schema()
    return bodies


def documents() -> dict[str, dict[str, Any]]:
    """Every document by name (the bundles last)."""
    bodies = _bodies()
    docs = {
        name: {"$schema": DIALECT, "$id": f"{ID_PREFIX}:{name.removeprefix('v2.')}", **body}
        for name, body in bodies.items()
    }
    titles = {
        "watching": "a watch frame (RFC-0002 §6.9)",
        "handover": "a control hand-over frame (RFC-0002 §6.1)",
        "steering": "a steer frame (RFC-0002 §6.10)",
        "library": "a session library frame (RFC-0002 §6.11)",
        "queue": "a prompt queue frame (RFC-0002 §6.12)",
    }
    for group in GROUPS:
        names = [f"v2.{kind}" for kind, bundle in BUNDLES.items() if bundle == f"v2.{group}"]
        docs[f"v2.{group}"] = {
            "$schema": DIALECT,
            "$id": f"{ID_PREFIX}:{group}",
            "title": f"magi-code protocol v2: {titles[group]}",
            "oneOf": [{"$ref": f"#/$defs/{name}"} for name in names],
            "$defs": {name: bodies[name] for name in names},
        }
    return docs
