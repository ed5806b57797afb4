"""The v2 approval frames (RFC-0002 §6.7) and the watch history's ``approval`` item (§6.9)
as shapes, and their JSON Schema documents (strict: exactly what this version sends and
accepts).

Values come from the frames' one declaration (``protocol.v2``); bounds owned by the layers
above name their source (``Shape.sources``), which a test resolves. Documents, by name:
``v2.<frame type>`` for ``approval_request``, ``approval_answer``, ``approval_resolved``,
``approval_already_resolved`` and ``approval_error``; ``v2.history.approval`` for the
history item; ``v2.approvals``, any of the frames (every document in its ``$defs``).
"""

from __future__ import annotations

from typing import Any, Final

from magi_code.protocol import v2
from magi_code.protocol.limits import MAX_ID_BYTES

from .model import Arr, Bool, Field, Int, Nullable, Obj, Shape, Str, to_schema

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX: Final = "urn:magi-code:protocol:v2"
BUNDLE: Final = "v2.approvals"

_ID: Final = Str(min_length=1, max_bytes=MAX_ID_BYTES, printable=True)
APPROVAL_ID: Final = Str(
    pattern=r"^appr_[0-9a-f]{24}$",
    max_bytes=MAX_ID_BYTES,
    example="appr_0123456789abcdef01234567",
    doc="The daemon's ID of the request.",
)
KIND: Final = Str(
    enum=v2.APPROVAL_KINDS,
    sources={"enum": "magi_code.turns.approvals:Kind"},
    doc="command: a shell command; file_change: a file write or edit; mcp_tool.",
)
# An answer, or how a request settled without one.
SETTLED_VALUES: Final = (*v2.APPROVAL_DECISIONS, v2.APPROVAL_TIMED_OUT, v2.APPROVAL_CANCELLED)
SETTLED: Final = Str(
    enum=SETTLED_VALUES,
    doc="The answer, or timed_out (the deadline) or cancelled (the turn ended).",
)
BY: Final = Str(
    min_length=1,
    max_bytes=MAX_ID_BYTES,
    printable=True,
    doc=f"The answering connection's <client_name>#<n>, or {v2.APPROVAL_DEADLINE_BY} "
    f"or {v2.APPROVAL_TURN_ENDED_BY}.",
)
_FRAME_ID: Final = Int(minimum=0, doc="The answer's id, as the client sent it.")


def _t(kind: str) -> Field:
    return Field(name="t", shape=Str(const=kind))


_WORD: Final = Str(
    max_bytes=4096, sources={"max_bytes": "magi_code.turns.approvals:MAX_WORD_BYTES"}
)
COMMAND_SUMMARY: Final = Obj(
    fields=(
        Field(
            name="argv",
            shape=Arr(
                items=_WORD,
                max_items=256,
                sources={"max_items": "magi_code.turns.approvals:MAX_SUMMARY_WORDS"},
            ),
            doc="The command's words as the shell reads them (secrets redacted).",
        ),
        Field(name="command", shape=_WORD, doc="The command line (secrets redacted)."),
        Field(name="truncated", shape=Bool(), doc="A word or the word list was cut."),
    ),
)
FILE_CHANGE_SUMMARY: Final = Obj(
    fields=(
        Field(name="path", shape=Str(min_length=1), doc="Project-relative."),
        Field(
            name="diff",
            shape=Str(
                max_bytes=64 * 1024,
                sources={"max_bytes": "magi_code.turns.approvals:MAX_DIFF_BYTES"},
            ),
            doc="A unified diff of the change (secrets redacted).",
        ),
        Field(name="truncated", shape=Bool(), doc="The diff was cut, or could not be made."),
    ),
)
MCP_TOOL_SUMMARY: Final = Obj(
    fields=(
        Field(name="server", shape=Str(min_length=1)),
        Field(name="tool", shape=Str(min_length=1)),
    ),
)
# Each kind's summary (the request document ties them with ``kind``).
SUMMARIES: Final[dict[str, Obj]] = {
    "command": COMMAND_SUMMARY,
    "file_change": FILE_CHANGE_SUMMARY,
    "mcp_tool": MCP_TOOL_SUMMARY,
}

APPROVAL_REQUEST: Final = Obj(
    doc="daemon → client: a tool call waits for an answer.",
    fields=(
        _t("approval_request"),
        Field(name="approval_id", shape=APPROVAL_ID),
        Field(name="turn_id", shape=_ID),
        Field(name="session_id", shape=_ID),
        Field(name="kind", shape=KIND),
        Field(
            name="activity_id",
            shape=Nullable(inner=_ID),
            doc="The tool call's turn.activity ID.",
        ),
        # ``summary`` is one of SUMMARIES, by ``kind`` (added by ``_request_schema``).
        Field(name="summary", shape=Obj(closed=False)),
        Field(
            name="options",
            shape=Arr(items=Str(enum=v2.APPROVAL_DECISIONS), min_items=1, max_items=5),
            doc="The answers offered (allow_project only in a trusted project).",
        ),
        Field(name="deadline_ms", shape=Int(minimum=0), doc="When it times out, Unix ms."),
    ),
)
APPROVAL_ANSWER: Final = Obj(
    doc="client → daemon: the answer to a request.",
    fields=(
        _t("approval_answer"),
        Field(name="id", shape=_FRAME_ID, doc="Echoed in the error or already-resolved answer."),
        Field(name="approval_id", shape=_ID),
        Field(name="decision", shape=Str(enum=v2.APPROVAL_DECISIONS)),
    ),
)
APPROVAL_RESOLVED: Final = Obj(
    doc="daemon → client: a request was settled (to every attached connection).",
    fields=(
        _t("approval_resolved"),
        Field(name="approval_id", shape=APPROVAL_ID),
        Field(name="decision", shape=SETTLED),
        Field(name="by", shape=BY),
    ),
)
APPROVAL_ALREADY_RESOLVED: Final = Obj(
    doc="daemon → client: an answer came after the request was settled.",
    fields=(
        _t("approval_already_resolved"),
        Field(name="id", shape=_FRAME_ID),
        Field(name="approval_id", shape=APPROVAL_ID),
        Field(name="decision", shape=SETTLED),
        Field(name="by", shape=BY),
    ),
)
APPROVAL_ERROR: Final = Obj(
    doc="daemon → client: an approval_answer or approval_policy frame was refused.",
    fields=(
        _t("approval_error"),
        Field(name="id", shape=Nullable(inner=_FRAME_ID)),
        Field(
            name="code",
            shape=Str(enum=(v2.Code.INVALID_REQUEST.value, v2.Code.UNKNOWN_APPROVAL.value)),
        ),
    ),
)
HISTORY_APPROVAL: Final = Obj(
    doc="A watch history item (§6.9): an approval where it was asked, as it settled.",
    fields=(
        Field(name="cursor", shape=_ID, doc="Watch again after it from here."),
        Field(name="kind", shape=Str(const="approval")),
        Field(name="turn_id", shape=_ID),
        Field(name="approval_id", shape=APPROVAL_ID),
        Field(name="approval_kind", shape=KIND),
        Field(
            name="subject",
            shape=Nullable(
                inner=Str(
                    max_bytes=1024,
                    sources={"max_bytes": "magi_code.core.approvals:MAX_SUBJECT_BYTES"},
                )
            ),
            doc="The command, the path, or server/tool, in one bounded line.",
        ),
        Field(
            name="decision",
            shape=Str(enum=(*SETTLED_VALUES, "pending")),
            doc="pending: never settled (its daemon stopped while it waited).",
        ),
        Field(name="by", shape=Nullable(inner=BY), doc="null while pending."),
    ),
)
FRAMES: Final[dict[str, Obj]] = {
    "approval_request": APPROVAL_REQUEST,
    "approval_answer": APPROVAL_ANSWER,
    "approval_resolved": APPROVAL_RESOLVED,
    "approval_already_resolved": APPROVAL_ALREADY_RESOLVED,
    "approval_error": APPROVAL_ERROR,
}


def shapes() -> dict[str, Shape]:
    """Every shape declared here, by document name."""
    named: dict[str, Shape] = {f"v2.{kind}": shape for kind, shape in FRAMES.items()}
    named["v2.history.approval"] = HISTORY_APPROVAL
    named.update({f"v2.summary.{kind}": shape for kind, shape in SUMMARIES.items()})
    return named


def _request_schema() -> dict[str, Any]:
    """``approval_request`` with its summary chosen by its kind."""
    schema = to_schema(APPROVAL_REQUEST, "strict", 1)
    schema["allOf"] = [
        {
            "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
            "then": {"properties": {"summary": to_schema(summary, "strict", 2)}},
        }
        for kind, summary in SUMMARIES.items()
    ]
    return schema


def documents() -> dict[str, dict[str, Any]]:
    """Every document by name (the bundle last)."""
    bodies = {f"v2.{kind}": to_schema(shape, "strict", 1) for kind, shape in FRAMES.items()}
    bodies["v2.approval_request"] = _request_schema()
    bodies["v2.history.approval"] = to_schema(HISTORY_APPROVAL, "strict", 2)
    docs = {
        name: {"$schema": DIALECT, "$id": f"{ID_PREFIX}:{name.removeprefix('v2.')}", **body}
        for name, body in bodies.items()
    }
    docs[BUNDLE] = {
        "$schema": DIALECT,
        "$id": f"{ID_PREFIX}:approvals",
        "title": "magi-code protocol v2: an approval frame (RFC-0002 §6.7)",
        "oneOf": [{"$ref": f"#/$defs/v2.{kind}"} for kind in FRAMES],
        "$defs": {name: bodies[name] for name in (f"v2.{kind}" for kind in FRAMES)},
    }
    return docs
