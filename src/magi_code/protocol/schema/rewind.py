"""The v2 fork and rewind frames (RFC-0002 §6.16) as shapes, and their JSON Schema
documents (strict: exactly what this version sends and accepts).

Values come from the frames' one declaration (``protocol.v2``); bounds owned by the layers
above name their source (``Shape.sources``), which a test resolves. Documents, by name:
``v2.<frame type>`` for ``session_fork``, ``session_rewind`` and ``rewind_result``;
``v2.rewind``, any of them (every document in its ``$defs``).
"""

from __future__ import annotations

from typing import Any, Final

from magi_code.protocol import v2
from magi_code.protocol.limits import MAX_ID_BYTES

from .model import Arr, Bool, Field, Int, Obj, Str, to_schema

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX: Final = "urn:magi-code:protocol:v2"
BUNDLE: Final = "v2.rewind"

_ID: Final = Str(min_length=1, max_bytes=MAX_ID_BYTES, printable=True)
_FRAME_ID: Final = Int(minimum=0, doc="The answer's id, as the client sent it.")
CURSOR: Final = Str(
    min_length=1,
    max_bytes=v2.MAX_CURSOR_BYTES,
    printable=True,
    doc="A session.replay cursor at a turn boundary: the start, or a terminal item's.",
)
_COUNT: Final = Int(minimum=0)


def _t(kind: str) -> Field:
    return Field(name="t", shape=Str(const=kind))


def _flag(name: str, default: bool, doc: str) -> Field:
    return Field(name=name, shape=Bool(), required=False, default=str(default).lower(), doc=doc)


SESSION_FORK: Final = Obj(
    doc="client → daemon: a new session with the history up to at_cursor.",
    fields=(
        _t("session_fork"),
        Field(name="id", shape=_FRAME_ID, doc="Echoed in session_result or session_error."),
        Field(name="session_id", shape=_ID),
        Field(name="at_cursor", shape=CURSOR),
    ),
)
SESSION_REWIND: Final = Obj(
    doc="client → daemon: a rewind's preview, or (commit) the rewind.",
    fields=(
        _t("session_rewind"),
        Field(name="id", shape=_FRAME_ID, doc="Echoed in rewind_result or session_error."),
        Field(name="session_id", shape=_ID),
        Field(name="at_cursor", shape=CURSOR),
        _flag("files", True, "Change the files back too."),
        _flag("commit", False, "Rewind (false: a preview only)."),
        _flag("force", False, "Also overwrite files changed outside the agent since."),
    ),
)
REWIND_FILE: Final = Obj(
    fields=(
        Field(name="path", shape=Str(min_length=1), doc="Relative to its turn's project."),
        Field(name="state", shape=Str(enum=v2.REWIND_FILE_STATES)),
    ),
)
REWIND_RESULT: Final = Obj(
    doc="daemon → client: what a rewind would do (a preview), or did (committed).",
    fields=(
        _t("rewind_result"),
        Field(name="id", shape=_FRAME_ID),
        Field(name="session_id", shape=_ID),
        Field(name="committed", shape=Bool()),
        Field(
            name="messages",
            shape=Arr(
                items=Obj(closed=False),
                max_items=64,
                sources={"max_items": "magi_code.sessions.rewind:MAX_SHOWN_MESSAGES"},
            ),
            doc="The replay items after the point (texts cut to 200 characters).",
        ),
        Field(name="message_count", shape=_COUNT),
        Field(
            name="files",
            shape=Arr(
                items=REWIND_FILE,
                max_items=128,
                sources={"max_items": "magi_code.sessions.rewind:MAX_SHOWN_FILES"},
            ),
        ),
        Field(name="file_count", shape=_COUNT),
        Field(name="file_states", shape=Obj(closed=False), doc="state → how many files."),
    ),
)
FRAMES: Final[dict[str, Obj]] = {
    "session_fork": SESSION_FORK,
    "session_rewind": SESSION_REWIND,
    "rewind_result": REWIND_RESULT,
}


def shapes() -> dict[str, Obj]:
    """Every shape declared here, by document name."""
    return {f"v2.{kind}": shape for kind, shape in FRAMES.items()}


def documents() -> dict[str, dict[str, Any]]:
    """Every document by name (the bundle last)."""
    bodies = {f"v2.{kind}": to_schema(shape, "strict", 1) for kind, shape in FRAMES.items()}
    docs = {
        name: {"$schema": DIALECT, "$id": f"{ID_PREFIX}:{name.removeprefix('v2.')}", **body}
        for name, body in bodies.items()
    }
    docs[BUNDLE] = {
        "$schema": DIALECT,
        "$id": f"{ID_PREFIX}:rewind",
        "title": "magi-code protocol v2: a fork or rewind frame (RFC-0002 §6.16)",
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in bodies],
        "$defs": bodies,
    }
    return docs
