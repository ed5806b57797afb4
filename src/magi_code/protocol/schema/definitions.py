"""The v1 protocol, declared once: envelopes, every operation (its request and response
payload, its errors, its session rule and gate, the service that runs it), every event,
and the error codes.

This module is the source of the shipped JSON Schema documents, of the reference tables
in ``docs/protocol/`` and of the route facts and request shapes in
``protocol/operations.py`` (generated: the coordinator routes by them and checks every
request payload against them, the capabilities list them). Adding an operation is its
declaration here and its handler in its service. It may only import the protocol
layer; values that other layers own (reasoning levels, activity enumerations, login
states, catalog states) are written out here and name their origin in ``sources``.
Tests resolve every source and compare, hold the service's request checks to every
request schema (case by case and as properties), and validate every record the service
writes in the process and conformance tests against the generated schemas, so a change
on either side that is not made on the other fails a test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final, Literal

from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ErrorCode
from magi_code.protocol.limits import (
    ADVERTISED_LIMITS,
    MAX_CATALOG_PAGE_ITEMS,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ID_BYTES,
    MAX_NAME_BYTES,
    MAX_NEGOTIATION_ITEMS,
    MAX_PAYLOAD_BYTES,
    MAX_SESSION_PAGE_ITEMS,
    MAX_SUMMARY_BYTES,
    PROTOCOL_VERSION,
)

from .model import (
    Arr,
    Bool,
    ExactlyOne,
    Field,
    Forbid,
    Int,
    Nullable,
    Obj,
    RequireAny,
    Str,
    Union,
)

E = ErrorCode
LIMIT: Final = {"max_items": E.LIMIT_EXCEEDED}

# -- shared shapes -------------------------------------------------------------------------

# IDs are opaque to clients: a consumer checks only what makes an ID safe to echo.
OPAQUE_ID: Final = Str(min_length=1, max_bytes=MAX_ID_BYTES, printable=True)
SESSION_ID_PATTERN: Final = r"^[A-Za-z0-9_][A-Za-z0-9_-]*$"
SESSION_ID: Final = Str(
    max_bytes=MAX_ID_BYTES,
    pattern=SESSION_ID_PATTERN,
    example="ses_01jd8w6c0zq6m3c2x9y4t5v7ab",
    counterexamples=("", "-x", "a.b", "a/b", "ses é"),
    consumer=OPAQUE_ID,
)
# An ID a request payload names: over the ID bound is ``limit_exceeded``, as for the
# envelope's IDs; any other string is looked up (an ID never issued is unknown).
ID_ARGUMENT: Final = Str(
    min_length=1, max_bytes=MAX_ID_BYTES, codes={"max_bytes": E.LIMIT_EXCEEDED}
)
SELECTION_ID_PATTERN: Final = r"^[A-Za-z0-9._/:-]{1,256}$"
SELECTION_ID: Final = Str(
    max_bytes=256,
    pattern=SELECTION_ID_PATTERN,
    sources={
        "pattern": "magi_code.config.ids:ID_PATTERN",
        "max_bytes": "magi_code.config.ids:MAX_SELECTION_ID_BYTES",
    },
    example="anthropic",
)
LABEL: Final = Str(
    min_length=1,
    max_bytes=128,
    sources={"max_bytes": "magi_code.config.ids:MAX_LABEL_BYTES"},
    doc="Display text: control and format characters removed, whitespace collapsed.",
)
THINKING_LEVELS: Final = ("default", "low", "medium", "high", "x_high", "max")
_LEVEL_SOURCE: Final = {"enum": "magi_code.config.ids:THINKING_LEVELS"}
THINKING_LEVEL: Final = Str(enum=THINKING_LEVELS, sources=_LEVEL_SOURCE)
LEVEL_LIST: Final = Arr(items=THINKING_LEVEL, min_items=1, max_items=len(THINKING_LEVELS))
SCOPES: Final = ("global", "project")
# The settings' ``sandbox`` levels (``config.schema.SANDBOX_LEVELS``; a test keeps them equal).
SANDBOX_LEVELS: Final = ("none", "workspace_write")
CATALOG_STATES: Final = ("fresh_cache", "stale", "unavailable")
CATALOG_STATE: Final = Str(
    enum=CATALOG_STATES,
    sources={"enum": "magi_code.config.catalog:CatalogState"},
    doc="`fresh_cache`: usable and selectable; `stale`: expired, shown but not selectable; "
    "`unavailable`: no usable cache.",
)
HASHED_ID: Final = Str(
    max_bytes=MAX_NAME_BYTES + 65,
    pattern=r"^[a-z][a-z0-9-]*:[0-9a-f]{64}$",
    example="tool:" + "0" * 64,
    doc="`<namespace>:<64 lowercase hex>`: a SHA-256 identity of runtime names; opaque.",
)
CURSOR: Final = Str(
    max_bytes=MAX_ID_BYTES,
    pattern=r"^[A-Za-z0-9_-]{1,58}$",
    example="AbCd",
    doc="Opaque replay position (unpadded URL-safe base64, at most 58 characters).",
    consumer=OPAQUE_ID,
)
RFC3339_MS: Final = Str(
    pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$",
    format="date-time",
    example="2025-01-01T00:00:00.000Z",
)
COUNT: Final = Int(minimum=0)
TITLE: Final = Str(
    min_length=1,
    max_length=80,
    sources={"max_length": "magi_code.sessions.titles:MAX_TITLE_CHARS"},
)
EMPTY: Final = Obj(doc="Always `{}`.")


def page_limit(maximum: int) -> Int:
    return Int(minimum=1, maximum=maximum, codes={"maximum": E.LIMIT_EXCEEDED})


# -- envelopes -----------------------------------------------------------------------------

METHOD_PATTERN: Final = r"^[a-z][a-z0-9_.]*$"
METHOD: Final = Str(max_bytes=MAX_NAME_BYTES, pattern=METHOD_PATTERN, example="status")
EVENT_ID: Final = Str(
    max_bytes=MAX_ID_BYTES, pattern=r"^evt-[1-9][0-9]*$", example="evt-1", consumer=OPAQUE_ID
)
VERSION: Final = Int(const=PROTOCOL_VERSION)
# Any payload, as an envelope sees it (its operation's or event's shape says the rest).
PAYLOAD: Final = Obj(closed=False, max_json_bytes=MAX_PAYLOAD_BYTES)

ERROR_CODES: Final = tuple(code.value for code in ErrorCode)
ERROR: Final = Obj(
    fields=(
        Field(
            name="code",
            shape=Str(
                enum=ERROR_CODES,
                max_bytes=MAX_NAME_BYTES,
                fallback="a failure of that request (never a success, never retried automatically)",
            ),
            doc="Stable machine-readable code (see the error table).",
        ),
        Field(
            name="message",
            shape=Str(min_length=1, max_bytes=MAX_ERROR_MESSAGE_BYTES),
            doc="Short fixed English text for the code; never contains request data.",
        ),
    )
)

REQUEST_ENVELOPE: Final = Obj(
    doc="What a client writes.",
    fields=(
        Field(name="protocol_version", shape=VERSION, doc="Always 1."),
        Field(name="kind", shape=Str(const="request"), doc="Always `request`."),
        Field(
            name="request_id",
            shape=OPAQUE_ID,
            doc="Chosen by the client; unique among its requests in flight.",
        ),
        Field(
            name="session_id",
            shape=Nullable(inner=OPAQUE_ID),
            required=False,
            default="no session (`null` is the same as absent)",
            doc="The session the request is about, where the method takes one.",
        ),
        Field(name="method", shape=METHOD, doc="The operation name."),
        Field(
            name="payload",
            shape=PAYLOAD,
            doc="The operation's arguments.",
        ),
    ),
)
RESPONSE_ENVELOPE: Final = Obj(
    doc="The service's one answer to a request.",
    fields=(
        Field(name="protocol_version", shape=VERSION, doc="Always 1."),
        Field(name="kind", shape=Str(const="response"), doc="Always `response`."),
        Field(
            name="request_id",
            shape=Nullable(inner=OPAQUE_ID),
            doc="The request's ID; `null` when the record had no safe ID (uncorrelated).",
        ),
        Field(
            name="session_id",
            shape=Nullable(inner=OPAQUE_ID),
            doc="The request's session ID if it was safe, or the session the operation "
            "created or used; otherwise `null`.",
        ),
        Field(
            name="method",
            shape=Nullable(inner=METHOD),
            doc="The request's method if it was a well-formed name, else `null`.",
        ),
        Field(
            name="payload",
            shape=Nullable(inner=PAYLOAD),
            doc="The result on success; `null` on error.",
        ),
        Field(name="error", shape=Nullable(inner=ERROR), doc="`null` on success."),
    ),
    rules=(ExactlyOne(names=("payload", "error")),),
)

# -- operations ----------------------------------------------------------------------------

SessionRule = Literal["forbidden", "required", "optional"]


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One v1 operation, declared once: the schemas, the reference docs, the route the
    coordinator applies and the checks of its request payload (``protocol/operations.py``,
    generated, and ``protocol/payloads.py``) all come from here. Its domain service
    supplies only the handler (and a check a shape cannot express, if any)."""

    name: str
    # The domain service that runs it (``composition``'s service keys; ``info``: the
    # service-information routes).
    service: str
    area: str
    summary: str
    request: Obj
    response: Obj
    session: SessionRule = "forbidden"
    # An optional outer ``session_id`` that is present must be a valid session ID.
    checks_session: bool = False
    # The outer ``session_id`` is checked before the payload (else after it).
    session_first: bool = False
    # Refused with ``not_initialized`` before ``initialize`` (after payload validation).
    gated: bool = True
    # Operation-specific errors beyond the envelope checks, each with when it happens.
    errors: tuple[tuple[ErrorCode, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class Event:
    name: str
    # The domain service that sends it.
    service: str
    summary: str
    payload: Obj | Union
    # Whose stream it belongs to: a turn (correlated to ``turn.start``) or a login.
    stream: Literal["turn", "login"]


LIMIT_DOCS: Final[Mapping[str, str]] = {
    "max_record_bytes": "One JSONL record, with its newline, in either direction.",
    "max_payload_bytes": "A `payload` encoded as compact JSON.",
    "max_error_message_bytes": "An error `message`.",
    "max_id_bytes": "A request, session, turn, login or event ID, and a replay cursor.",
    "max_name_bytes": "A method or event name, and a requested capability.",
    "max_string_bytes": "Any JSON string or object key (UTF-8).",
    "max_json_depth": "Nesting of objects and arrays; the record itself is level 1.",
    "max_array_items": "Items of any array.",
    "max_object_fields": "Members of any object.",
    "max_negotiation_items": "Items of each `initialize` list.",
    "max_session_attachments": "Sessions one client holds attached at a time.",
    "max_session_page_items": "Items of a `session.list` or `session.replay` page.",
    "max_session_replay_page_bytes": "A `session.replay` payload, encoded.",
    "max_session_replay_window_bytes": "The tail of a history that replay reads.",
    "max_session_list_scan_entries": "Directory entries one `session.list` examines.",
    "max_catalog_page_items": "Entries of a catalog page.",
}
# A later v1 service may advertise other values and more limits: a consumer checks that
# each is a positive integer every JSON implementation represents exactly (2**53 - 1),
# then against its own bounds.
ADVERTISED_BOUND: Final = Int(minimum=1, maximum=2**53 - 1)
LIMITS: Final = Obj(
    doc="The bounds this service enforces, in bytes or items.",
    fields=tuple(
        Field(name=name, shape=Int(const=value, consumer=ADVERTISED_BOUND), doc=LIMIT_DOCS[name])
        for name, value in ADVERTISED_LIMITS.items()
    ),
    unknown=ADVERTISED_BOUND,
)
ACTIVITY_CAPABILITIES: Final = Obj(
    doc="What `turn.activity` reports in this version.",
    sources={"fields": "magi_code.core.service_info:ACTIVITY_CAPABILITIES"},
    fields=(
        Field(name="events", shape=Bool(const=True), doc="`turn.activity` events are sent."),
        Field(name="approvals", shape=Bool(const=False), doc="No approval requests."),
        Field(name="steering", shape=Bool(const=False), doc="No steering of a running turn."),
        Field(
            name="mcp_server_lifecycle",
            shape=Bool(const=False),
            doc="No MCP server start/stop activity.",
        ),
        Field(name="mcp_tool_activity", shape=Bool(const=True), doc="MCP tool calls appear."),
        Field(name="subagents", shape=Bool(const=True), doc="Subagent activity appears."),
        Field(name="raw_tool_output", shape=Bool(const=False), doc="Tool output is never sent."),
        Field(name="activity_replay", shape=Bool(const=False), doc="Replay has no activity."),
        Field(
            name="max_summary_bytes",
            shape=Int(const=MAX_SUMMARY_BYTES),
            doc="Bound of a reasoning summary's text.",
        ),
    ),
)
TRANSPORTS: Final = ("stdio", "unix")
TRANSPORT_NAME: Final = Str(
    enum=TRANSPORTS,
    max_bytes=MAX_NAME_BYTES,
    fallback="a transport this client does not use (ignored)",
)
# Stands for the capabilities object in the declarations, which it lists: replaced by
# ``CAPABILITIES`` once they are all declared (the end of this module).
_CAPABILITIES_SLOT: Final = Obj(doc="Replaced by CAPABILITIES.")

PAGE_AFTER_SESSION: Final = Field(
    name="after",
    shape=Nullable(
        inner=Str(
            max_bytes=MAX_ID_BYTES,
            pattern=SESSION_ID_PATTERN,
            codes={"pattern": E.INVALID_SESSION_ID},
            example="ses_a",
            counterexamples=("", "-x", "a.b"),
        )
    ),
    required=False,
    default="`null`: from the start",
    doc="List sessions whose ID sorts after this one (the previous page's `next_after`).",
)
SESSION_PAGE_LIMIT: Final = Field(
    name="limit",
    shape=page_limit(MAX_SESSION_PAGE_ITEMS),
    required=False,
    default="32",
    doc="Most items on the page.",
)
CATALOG_OFFSET: Final = Field(
    name="offset",
    shape=Int(minimum=0, maximum=100_000, codes={"maximum": E.LIMIT_EXCEEDED}),
    required=False,
    default="0",
    doc="Index of the first entry.",
)
CATALOG_LIMIT: Final = Field(
    name="limit",
    shape=page_limit(MAX_CATALOG_PAGE_ITEMS),
    required=False,
    default="32",
    doc="Most entries on the page.",
)
NEXT_OFFSET: Final = Field(
    name="next_offset",
    shape=Nullable(inner=Int(minimum=1)),
    doc="The `offset` of the next page; `null` on the last page.",
)
CACHE_ONLY: Final = Field(
    name="refresh",
    shape=Str(const="cache_only"),
    doc="Always `cache_only`: reads never contact a provider.",
)
CONFIG: Final = Obj(
    doc="The effective configuration.",
    fields=(
        Field(
            name="selection",
            shape=Obj(
                fields=(
                    Field(name="provider_id", shape=SELECTION_ID),
                    Field(name="model_id", shape=SELECTION_ID),
                )
            ),
            doc="The provider and model a new turn uses (environment > project > global > "
            "defaults).",
        ),
        Field(
            name="thinking_level",
            shape=THINKING_LEVEL,
            doc="The level a new turn uses: the configured one if the model offers it, "
            "else `default`.",
        ),
        Field(
            name="configured_thinking_level",
            shape=THINKING_LEVEL,
            doc="The stored level (project, else global, else `default`).",
        ),
        Field(
            name="available_thinking_levels",
            shape=LEVEL_LIST,
            doc="The levels the selected model offers, in wire order.",
        ),
        Field(name="fast", shape=Bool(), doc="Fast mode (global setting only)."),
        Field(
            name="precedence",
            shape=Arr(items=Str(), const=("environment", "project", "global")),
            doc='Always `["environment", "project", "global"]`.',
        ),
        Field(
            name="writable_scopes",
            shape=Arr(items=Str(enum=SCOPES), const=SCOPES),
            doc='Always `["global", "project"]`.',
        ),
        Field(
            name="global_only",
            shape=Arr(items=Str(), const=("fast",)),
            doc='Always `["fast"]`: settings `config.set` accepts only with `global`.',
        ),
        Field(
            name="sandbox",
            required=False,
            shape=Obj(
                fields=(
                    Field(
                        name="level",
                        shape=Str(enum=SANDBOX_LEVELS),
                        doc="Where a turn's shell and hook commands run (the stricter of the "
                        "global and project `sandbox` settings).",
                    ),
                    Field(
                        name="network",
                        shape=Bool(),
                        doc="Whether the `workspace_write` sandbox shares the host network.",
                    ),
                    Field(
                        name="workspace_write_available",
                        shape=Bool(),
                        doc="Whether this service can start the `workspace_write` sandbox; "
                        "a turn that asks for it where it cannot fails "
                        "(`sandbox_unavailable`).",
                    ),
                )
            ),
            doc="The sandbox a turn here gets (`docs/safety.md`). Always sent by this "
            "service; absent from older ones.",
        ),
    ),
)

SESSION_STATUS_OPEN: Final = Obj(
    fields=(
        Field(name="session_id", shape=SESSION_ID, doc="The session."),
        Field(name="status", shape=Str(const="open"), doc="Always `open`."),
    )
)
REPLAY_TEXT: Final = Str(
    max_bytes=2048, sources={"max_bytes": "magi_code.sessions.projection:MAX_PART_BYTES"}
)
_PART_FIELDS: Final = (
    Field(name="text", shape=REPLAY_TEXT, doc="This part's text (at most 2,048 bytes)."),
    Field(name="part", shape=COUNT, doc="Part number within the message, from 0."),
    Field(name="last_part", shape=Bool(), doc="Whether this part ends the message."),
)
REPLAY_ITEM: Final = Union(
    tag="kind",
    doc="One projected history item.",
    variants=(
        Obj(
            doc="A part of a user or assistant message.",
            fields=(
                Field(name="cursor", shape=CURSOR, doc="Position after this item."),
                Field(name="kind", shape=Str(const="message")),
                Field(name="role", shape=Str(enum=("user", "assistant")), doc="Who wrote it."),
                *_PART_FIELDS,
            ),
        ),
        Obj(
            doc="A part of the compaction summary that replaces earlier history.",
            fields=(
                Field(name="cursor", shape=CURSOR, doc="Position after this item."),
                Field(name="kind", shape=Str(const="summary")),
                *_PART_FIELDS,
            ),
        ),
        Obj(
            doc="The end of a turn.",
            fields=(
                Field(name="cursor", shape=CURSOR, doc="Position after this item."),
                Field(name="kind", shape=Str(const="terminal")),
                Field(
                    name="status",
                    shape=Str(
                        enum=("completed", "cancelled", "failed", "compaction_required"),
                        sources={"enum": "magi_code.sessions.records:TerminalStatus"},
                    ),
                    doc="How the turn ended.",
                ),
            ),
        ),
    ),
)

AUTH_ENTRY: Final = Obj(
    fields=(
        Field(name="provider_id", shape=SELECTION_ID, doc="The provider."),
        Field(
            name="auth_method",
            shape=Str(enum=("oauth", "api_key", "none")),
            doc="How the provider authenticates.",
        ),
        Field(
            name="source",
            shape=Str(enum=("shared_store", "environment", "none")),
            doc="Where the credential is (or would be) found.",
        ),
        Field(
            name="readiness",
            shape=Str(enum=("ready", "missing", "needs_login")),
            doc="Whether a turn could authenticate now.",
        ),
        Field(name="ready", shape=Bool(), doc='`readiness == "ready"`.'),
    )
)

_DECLARED: Final[tuple[Operation, ...]] = (
    Operation(
        name="initialize",
        service="info",
        area="discovery",
        summary="Negotiate the protocol version; unlocks every other operation.",
        session="optional",
        gated=False,
        request=Obj(
            fields=(
                Field(
                    name="supported_protocol_versions",
                    shape=Arr(
                        items=Int(minimum=0, maximum=0xFFFF),
                        min_items=1,
                        max_items=MAX_NEGOTIATION_ITEMS,
                        codes={"min_items": E.LIMIT_EXCEEDED, "max_items": E.LIMIT_EXCEEDED},
                    ),
                    doc="Versions the client speaks; must contain 1.",
                ),
                Field(
                    name="requested_capabilities",
                    shape=Arr(
                        items=Str(max_bytes=MAX_NAME_BYTES, codes={"max_bytes": E.LIMIT_EXCEEDED}),
                        max_items=MAX_NEGOTIATION_ITEMS,
                        codes=LIMIT,
                    ),
                    required=False,
                    default="`[]`",
                    doc="Operation names the client needs; each must be advertised.",
                ),
            )
        ),
        response=Obj(
            fields=(
                Field(name="protocol_version", shape=VERSION, doc="The chosen version: 1."),
                Field(
                    name="server_name",
                    shape=Str(
                        const="magi-code",
                        sources={"const": "magi_code.core.service_info:SERVER_NAME"},
                    ),
                    doc="Always `magi-code`.",
                ),
                Field(
                    name="server_version",
                    shape=Str(min_length=1),
                    doc="The installed package version.",
                ),
                Field(name="limits", shape=LIMITS, doc="The service's bounds."),
                Field(name="capabilities", shape=_CAPABILITIES_SLOT, doc="As `capabilities`."),
            )
        ),
        errors=(
            (E.UNSUPPORTED_VERSION, "`supported_protocol_versions` does not contain 1"),
            (E.UNSUPPORTED_CAPABILITY, "a requested name is not an advertised operation"),
        ),
    ),
    Operation(
        name="status",
        service="info",
        area="discovery",
        summary="Liveness and whether the selected provider could authenticate.",
        session="optional",
        request=EMPTY,
        response=Obj(
            fields=(
                Field(name="service", shape=Str(const="ready"), doc="Always `ready`."),
                Field(
                    name="provider_auth_ready",
                    shape=Bool(),
                    doc="Whether the effective provider selection has a usable credential "
                    "now (no refresh, no network).",
                ),
            )
        ),
        errors=((E.INTERNAL_ERROR, "settings or the credential store cannot be read"),),
    ),
    Operation(
        name="capabilities",
        service="info",
        area="discovery",
        summary="What this service implements.",
        session="optional",
        request=EMPTY,
        response=_CAPABILITIES_SLOT,
    ),
    Operation(
        name="session.list",
        service="sessions",
        area="sessions",
        summary="One page of durable sessions, ordered by session ID.",
        request=Obj(fields=(PAGE_AFTER_SESSION, SESSION_PAGE_LIMIT), check_order=("limit",)),
        response=Obj(
            fields=(
                Field(
                    name="sessions",
                    shape=Arr(
                        max_items=MAX_SESSION_PAGE_ITEMS,
                        items=Obj(
                            fields=(
                                Field(name="session_id", shape=SESSION_ID, doc="The session."),
                                Field(
                                    name="title",
                                    shape=Nullable(inner=TITLE),
                                    doc="Sanitized first line of the first prompt (at most 80 "
                                    "characters), or `null`.",
                                ),
                                Field(
                                    name="updated_at",
                                    shape=RFC3339_MS,
                                    doc="Last change of its history, RFC 3339 UTC.",
                                ),
                            )
                        ),
                    ),
                    doc="The page, in ID order.",
                ),
                Field(
                    name="next_after",
                    shape=Nullable(inner=SESSION_ID),
                    doc="Pass as `after` for the next page; `null` on the last page.",
                ),
                Field(name="truncated", shape=Bool(), doc="More sessions follow this page."),
                Field(
                    name="incomplete",
                    shape=Bool(),
                    doc="Some candidates could not be read or represented: the list may miss "
                    "sessions. Not a continuation flag (that is `truncated`).",
                ),
            )
        ),
        errors=(
            (E.INVALID_SESSION_ID, "`after` is not a valid session ID"),
            (
                E.LIMIT_EXCEEDED,
                "the sessions directory holds more than 20,000 entries (the scan budget)",
            ),
            (E.SESSION_UNAVAILABLE, "the sessions directory cannot be read"),
        ),
    ),
    Operation(
        name="session.create",
        service="sessions",
        area="sessions",
        summary="Create a durable session and attach this client to it.",
        request=EMPTY,
        response=SESSION_STATUS_OPEN,
        errors=(
            (E.LIMIT_EXCEEDED, "this client already holds 16 sessions"),
            (E.SESSION_UNAVAILABLE, "the session could not be created"),
        ),
    ),
    Operation(
        name="session.open",
        service="sessions",
        area="sessions",
        summary="Attach this client to an existing session (take its writer lease).",
        session="required",
        request=EMPTY,
        response=SESSION_STATUS_OPEN,
        errors=(
            (E.INVALID_SESSION_ID, "the outer `session_id` is missing or not a session ID"),
            (E.SESSION_BUSY, "another client (or process) holds the session, or it is closing"),
            (E.SESSION_UNAVAILABLE, "no such session, or it cannot be read"),
            (E.LIMIT_EXCEEDED, "this client already holds 16 sessions"),
        ),
    ),
    Operation(
        name="session.replay",
        service="sessions",
        area="sessions",
        summary="One page of a session's history projected for display, from a cursor.",
        session="required",
        session_first=True,
        request=Obj(
            check_order=("limit",),
            fields=(
                Field(
                    name="after",
                    shape=Nullable(inner=Str(max_bytes=MAX_ID_BYTES)),
                    required=False,
                    default="`null`: from the start",
                    doc="A cursor from an earlier page; an unmatched one gives "
                    "`resync_required`, not an error.",
                ),
                SESSION_PAGE_LIMIT,
            ),
        ),
        response=Obj(
            fields=(
                Field(
                    name="events",
                    shape=Arr(items=REPLAY_ITEM, max_items=MAX_SESSION_PAGE_ITEMS),
                    doc="The page (its encoded payload is at most 16,384 bytes).",
                ),
                Field(
                    name="next_cursor",
                    shape=CURSOR,
                    doc="Pass as `after` for the next page: the last item's cursor, or the "
                    "accepted position of an empty page.",
                ),
                Field(
                    name="snapshot_cursor",
                    shape=CURSOR,
                    doc="The cursor of the last item the history had when read.",
                ),
                Field(name="truncated", shape=Bool(), doc="More items follow this page."),
                Field(
                    name="gap",
                    shape=Bool(),
                    doc="Some history could not be read or lies outside the replay window.",
                ),
                Field(
                    name="resync_required",
                    shape=Bool(),
                    doc="`after` no longer names a position: start again without it.",
                ),
            )
        ),
        errors=(
            (E.INVALID_SESSION_ID, "the outer `session_id` is missing or not a session ID"),
            (E.SESSION_UNAVAILABLE, "no such session, or its history cannot be read"),
            (E.SESSION_BUSY, "an append holds the history lock for longer than ~50 ms"),
        ),
    ),
    Operation(
        name="session.close",
        service="sessions",
        area="sessions",
        summary="Release this client's attachment (idempotent).",
        session="required",
        request=EMPTY,
        response=Obj(
            fields=(
                Field(name="session_id", shape=SESSION_ID, doc="The session."),
                Field(
                    name="status",
                    shape=Str(enum=("closed", "closing")),
                    doc="`closing`: a turn was running; it is cancelled and the session is "
                    "released after its terminal.",
                ),
            )
        ),
        errors=((E.INVALID_SESSION_ID, "the outer `session_id` is missing or not a session ID"),),
    ),
    Operation(
        name="turn.start",
        service="turns",
        area="turns",
        summary="Run one agent turn on a session (a new one when `session_id` is absent).",
        session="optional",
        checks_session=True,
        request=Obj(
            fields=(
                Field(
                    name="prompt",
                    shape=Str(non_blank=True),
                    doc="The user message; must contain a non-whitespace character.",
                ),
                Field(
                    name="options",
                    shape=Obj(doc="Reserved."),
                    required=False,
                    default="`{}`",
                    doc="Must be `{}` when present.",
                ),
            )
        ),
        response=Obj(
            fields=(
                Field(name="turn_id", shape=OPAQUE_ID, doc="The new turn."),
                Field(name="session_id", shape=SESSION_ID, doc="The turn's session."),
                Field(name="status", shape=Str(const="accepted"), doc="Always `accepted`."),
            )
        ),
        errors=(
            (E.INVALID_SESSION_ID, "the outer `session_id` is not a session ID"),
            (E.TOO_MANY_ACTIVE_TURNS, "this client already runs 16 turns"),
            (E.SESSION_BUSY, "the session runs a turn, is closing, or another client holds it"),
            (E.SESSION_UNAVAILABLE, "no such session, or its history cannot be read"),
            (E.LIMIT_EXCEEDED, "a new attachment would exceed 16 sessions"),
            (
                E.CONFIGURATION_BUSY,
                "persistent (v2) clients only: another turn's settings capture or a "
                "`config.set` write is in progress",
            ),
        ),
    ),
    Operation(
        name="turn.cancel",
        service="turns",
        area="turns",
        summary="Ask a running turn of this client to stop.",
        session="optional",
        request=Obj(fields=(Field(name="turn_id", shape=ID_ARGUMENT, doc="The turn to cancel."),)),
        response=Obj(
            fields=(
                Field(name="turn_id", shape=OPAQUE_ID, doc="The turn."),
                Field(
                    name="status",
                    shape=Str(const="cancellation_requested"),
                    doc="Always `cancellation_requested`; the terminal tells the outcome.",
                ),
            )
        ),
        errors=((E.UNKNOWN_TURN, "no running turn of this client has that ID"),),
    ),
    Operation(
        name="auth.status",
        service="auth",
        area="auth",
        summary="Credential readiness of every known provider.",
        request=EMPTY,
        response=Obj(
            fields=(
                Field(
                    name="providers",
                    shape=Arr(items=AUTH_ENTRY),
                    doc="`openai-codex`, `anthropic`, then custom providers by ID.",
                ),
            )
        ),
        errors=((E.INTERNAL_ERROR, "settings or the credential store cannot be read"),),
    ),
    Operation(
        name="auth.login.start",
        service="auth",
        area="auth",
        summary="Start the one ChatGPT (Codex) OAuth login; progress follows as events.",
        request=Obj(
            fields=(
                Field(
                    name="provider_id",
                    shape=Str(min_length=1),
                    doc="Must be `openai-codex`.",
                ),
            )
        ),
        response=Obj(
            fields=(
                Field(name="login_id", shape=OPAQUE_ID, doc="The login attempt."),
                Field(name="provider_id", shape=SELECTION_ID, doc="The provider."),
                Field(name="status", shape=Str(const="started"), doc="Always `started`."),
            )
        ),
        errors=(
            (E.PROVIDER_UNAVAILABLE, "the provider has no interactive login"),
            (E.AUTH_BUSY, "a login is already active"),
        ),
    ),
    Operation(
        name="auth.login.callback",
        service="auth",
        area="auth",
        summary="Hand the login the final redirect URL or code pasted by the user.",
        request=Obj(
            fields=(
                Field(name="login_id", shape=ID_ARGUMENT, doc="The login attempt."),
                Field(
                    name="input",
                    shape=Str(
                        min_length=1,
                        max_bytes=4096,
                        late=frozenset({"min_length", "max_bytes"}),
                        sources={"max_bytes": "magi_code.auth.login:MAX_CALLBACK_INPUT_BYTES"},
                    ),
                    doc="The redirect URL, a `code=…&state=…` query, `code#state` or a bare "
                    "code; 1 to 4,096 bytes (checked after the login is found).",
                ),
            )
        ),
        response=Obj(
            fields=(
                Field(name="login_id", shape=OPAQUE_ID, doc="The login attempt."),
                Field(name="status", shape=Str(const="submitted"), doc="Always `submitted`."),
            )
        ),
        errors=(
            (E.UNKNOWN_LOGIN, "no active login has that ID"),
            (E.AUTH_BUSY, "a callback was already received for this login"),
        ),
    ),
    Operation(
        name="auth.login.cancel",
        service="auth",
        area="auth",
        summary="Ask the active login to stop.",
        request=Obj(fields=(Field(name="login_id", shape=ID_ARGUMENT, doc="The login attempt."),)),
        response=Obj(
            fields=(
                Field(name="login_id", shape=OPAQUE_ID, doc="The login attempt."),
                Field(
                    name="status",
                    shape=Str(const="cancellation_requested"),
                    doc="Always `cancellation_requested`; the terminal tells the outcome.",
                ),
            )
        ),
        errors=((E.UNKNOWN_LOGIN, "no active login has that ID"),),
    ),
    Operation(
        name="auth.logout",
        service="auth",
        area="auth",
        summary="Remove one provider's stored credential.",
        request=Obj(
            fields=(
                Field(name="provider_id", shape=Str(min_length=1), doc="The provider."),
                Field(
                    name="confirmed",
                    shape=Bool(),
                    required=False,
                    default="`false`",
                    doc="Must be `true`.",
                ),
            )
        ),
        response=Obj(
            fields=(
                Field(name="provider_id", shape=SELECTION_ID, doc="The provider."),
                Field(name="status", shape=Str(const="logged_out"), doc="Always `logged_out`."),
                Field(name="removed", shape=Bool(), doc="Whether a stored record existed."),
                Field(
                    name="environment_unchanged",
                    shape=Bool(const=True),
                    doc="Always `true`: environment credentials are not touched.",
                ),
            )
        ),
        errors=(
            (E.PROVIDER_UNAVAILABLE, "the provider is neither built in nor configured"),
            (E.CONFIRMATION_REQUIRED, "`confirmed` is not `true`"),
            (E.INTERNAL_ERROR, "the credential store cannot be read or written"),
        ),
    ),
    Operation(
        name="catalog.providers",
        service="configuration",
        area="catalogs and configuration",
        summary="One page of the configured providers.",
        request=Obj(fields=(CATALOG_OFFSET, CATALOG_LIMIT), by_constraint=True),
        response=Obj(
            fields=(
                Field(
                    name="entries",
                    shape=Arr(
                        max_items=MAX_CATALOG_PAGE_ITEMS,
                        items=Obj(
                            fields=(
                                Field(name="provider_id", shape=SELECTION_ID, doc="The ID."),
                                Field(name="label", shape=LABEL, doc="Display name."),
                            )
                        ),
                    ),
                    doc="Every provider (built-in and custom) once, sorted by ID.",
                ),
                NEXT_OFFSET,
                CACHE_ONLY,
            )
        ),
        errors=(
            (E.CONFIGURATION_BUSY, "another catalog/config request of this client is running"),
            (E.CONFIGURATION_UNAVAILABLE, "settings cannot be read"),
        ),
    ),
    Operation(
        name="catalog.models",
        service="configuration",
        area="catalogs and configuration",
        summary="One page of a provider's cached models (never contacts the provider).",
        request=Obj(
            fields=(
                Field(name="provider_id", shape=Str(), doc="The provider."),
                CATALOG_OFFSET,
                CATALOG_LIMIT,
            ),
            by_constraint=True,
        ),
        response=Obj(
            fields=(
                Field(
                    name="entries",
                    shape=Arr(
                        max_items=MAX_CATALOG_PAGE_ITEMS,
                        items=Obj(
                            fields=(
                                Field(name="provider_id", shape=SELECTION_ID, doc="The provider."),
                                Field(name="model_id", shape=SELECTION_ID, doc="The model."),
                                Field(name="label", shape=LABEL, doc="Display name."),
                                Field(
                                    name="available",
                                    shape=Bool(),
                                    doc="Selectable now: fresh cache and not disabled.",
                                ),
                                Field(
                                    name="context_window",
                                    shape=Nullable(inner=Int(minimum=1)),
                                    doc="Tokens, when known.",
                                ),
                                Field(
                                    name="max_output_tokens",
                                    shape=Nullable(inner=Int(minimum=1)),
                                    doc="Tokens, when known.",
                                ),
                                Field(
                                    name="available_thinking_levels",
                                    shape=LEVEL_LIST,
                                    doc="Reasoning levels, in wire order.",
                                ),
                            )
                        ),
                    ),
                    doc="Models in cache order.",
                ),
                NEXT_OFFSET,
                Field(name="state", shape=CATALOG_STATE, doc="The cache's state."),
                CACHE_ONLY,
            )
        ),
        errors=(
            (E.INVALID_SELECTION, "the provider ID is unsafe or unknown"),
            (E.CONFIGURATION_BUSY, "another catalog/config request of this client is running"),
            (E.CONFIGURATION_UNAVAILABLE, "settings cannot be read"),
        ),
    ),
    Operation(
        name="catalog.refresh",
        service="configuration",
        area="catalogs and configuration",
        summary="Fetch a provider's model list and replace its cache.",
        request=Obj(fields=(Field(name="provider_id", shape=Str(), doc="The provider."),)),
        response=Obj(
            fields=(
                Field(name="provider_id", shape=SELECTION_ID, doc="The provider."),
                Field(name="state", shape=CATALOG_STATE, doc="The cache's state after writing."),
            )
        ),
        errors=(
            (E.INVALID_SELECTION, "the provider ID is unsafe or unknown"),
            (
                E.CATALOG_REFRESH_FAILED,
                "discovery failed, found no usable model, or the cache "
                "could not be written (the old cache is kept)",
            ),
            (
                E.CONFIGURATION_BUSY,
                "another request of this client runs, or a refresh of this provider is running",
            ),
            (E.CONFIGURATION_UNAVAILABLE, "settings cannot be read"),
        ),
    ),
    Operation(
        name="config.get",
        service="configuration",
        area="catalogs and configuration",
        summary="The effective configuration.",
        request=EMPTY,
        response=CONFIG,
        errors=(
            (E.CONFIGURATION_BUSY, "another catalog/config request of this client is running"),
            (
                E.CONFIGURATION_UNAVAILABLE,
                "settings cannot be read, or `MC_PROVIDER`/`MC_MODEL` is unsafe",
            ),
        ),
    ),
    Operation(
        name="config.set",
        service="configuration",
        area="catalogs and configuration",
        summary="Persist a selection, reasoning level and/or fast mode in one scope.",
        request=Obj(
            rules=(
                RequireAny(names=("selection", "thinking_level", "fast")),
                Forbid(when="scope", value="project", forbidden="fast", code=E.INVALID_SCOPE),
            ),
            fields=(
                Field(
                    name="scope",
                    shape=Str(
                        enum=SCOPES,
                        codes={"enum": E.INVALID_SCOPE},
                        sources={"enum": "magi_code.config.settings:Scope"},
                    ),
                    doc="`global` (`$MC_HOME/settings.json`) or `project` "
                    "(`<project>/.magi-code/settings.json`).",
                ),
                Field(
                    name="selection",
                    shape=Obj(
                        fields=(
                            Field(name="provider_id", shape=Str(), doc="The provider."),
                            Field(name="model_id", shape=Str(), doc="The model."),
                        )
                    ),
                    required=False,
                    doc="Provider and model; the model must be in the provider's fresh "
                    "catalog. Without `thinking_level` the level is reset to `default`.",
                ),
                Field(
                    name="thinking_level",
                    shape=THINKING_LEVEL,
                    required=False,
                    doc="Must be offered by the target model.",
                ),
                Field(
                    name="fast",
                    shape=Bool(),
                    required=False,
                    doc="Fast mode; `global` scope only.",
                ),
            ),
        ),
        response=Obj(
            fields=(
                Field(name="persisted", shape=Bool(const=True), doc="Always `true`."),
                Field(name="scope", shape=Str(enum=SCOPES), doc="The scope written."),
                Field(
                    name="effective",
                    shape=CONFIG,
                    doc="The effective configuration re-read after the write (higher layers "
                    "may mask the change).",
                ),
            )
        ),
        errors=(
            (E.INVALID_SCOPE, "unknown scope, or `fast` with `project`"),
            (E.INVALID_SELECTION, "provider or model unknown, unsafe or disabled"),
            (E.CATALOG_UNAVAILABLE, "the target provider has no usable catalog"),
            (E.CATALOG_STALE, "the target provider's catalog is expired"),
            (E.UNSUPPORTED_REASONING, "the target model does not offer the level"),
            (
                E.CONFIGURATION_BUSY,
                "another request of this client, a write of the same file, "
                "or a turn's settings capture is running",
            ),
            (E.CONFIGURATION_UNAVAILABLE, "the current settings cannot be read"),
            (E.SETTINGS_WRITE_FAILED, "the file could not be locked, validated or written"),
        ),
    ),
)

# -- events --------------------------------------------------------------------------------

TURN_ID: Final = Field(name="turn_id", shape=OPAQUE_ID, doc="The turn.")
LIFECYCLE_STATUSES: Final = ("queued", "running", "writing", "completed", "failed", "cancelled")
_LIFECYCLE_STATUS: Final = Str(
    enum=LIFECYCLE_STATUSES,
    sources={"enum": "magi_code.turns.activity:LifecycleStatus"},
)
ACTIVITY_ID: Final = Field(name="activity_id", shape=HASHED_ID, doc="Stable per activity.")
DETAILS_OMITTED: Final = Field(
    name="details_omitted",
    shape=Bool(const=True),
    doc="Always `true`: arguments, results and commands are never sent.",
)
ACTIVITY: Final = Union(
    tag="kind",
    doc="One flattened activity object; `kind` says which.",
    variants=(
        Obj(
            doc="A step of the turn changed state (tools inside subagents, subagent tasks, "
            "finishing steps).",
            fields=(
                ACTIVITY_ID,
                Field(name="kind", shape=Str(const="lifecycle")),
                Field(
                    name="category",
                    shape=Str(
                        enum=(
                            "tool",
                            "hook",
                            "context_injection",
                            "subagent_batch",
                            "subagent_task",
                            "assistant",
                            "diagnostic",
                            "compaction",
                            "activity",
                        ),
                        sources={"enum": "magi_code.turns.activity:lifecycle.category"},
                    ),
                    doc="What started (`activity`: a later state of an activity already reported).",
                ),
                Field(name="status", shape=_LIFECYCLE_STATUS, doc="Its state."),
                DETAILS_OMITTED,
                Field(
                    name="parent_activity_id",
                    shape=HASHED_ID,
                    required=False,
                    doc="The enclosing activity, when there is one: the `task` tool call of a "
                    "subagent task, the subagent task of a subagent's tool.",
                ),
            ),
        ),
        Obj(
            doc="A tool call of the main agent.",
            fields=(
                ACTIVITY_ID,
                Field(name="kind", shape=Str(const="tool")),
                Field(name="tool_id", shape=HASHED_ID, doc="Identity of the tool."),
                Field(
                    name="tool_name",
                    shape=Nullable(
                        inner=Str(
                            enum=(
                                "edit_file",
                                "grep",
                                "list_files",
                                "read_file",
                                "shell",
                                "skill",
                                "task",
                                "write_file",
                            ),
                            sources={"enum": "magi_code.turns.runtime:ALLOWLISTED_TOOL_NAMES"},
                        )
                    ),
                    doc="The name of a built-in tool; `null` for every other tool.",
                ),
                Field(
                    name="server_id",
                    shape=Nullable(inner=HASHED_ID),
                    doc="Identity of the MCP server; `null` for local tools.",
                ),
                Field(
                    name="transport",
                    shape=Str(enum=("local", "mcp", "unknown")),
                    doc="Where the tool runs (`unknown`: not known; this service sends "
                    "`local` or `mcp`).",
                ),
                Field(name="status", shape=_LIFECYCLE_STATUS, doc="`running`, then an end state."),
                Field(
                    name="timed_out",
                    shape=Nullable(inner=Bool()),
                    doc="Whether the tool hit its timeout; `null` when it has none.",
                ),
                DETAILS_OMITTED,
                Field(
                    name="parent_activity_id",
                    shape=HASHED_ID,
                    required=False,
                    doc="The `subagent_batch` the call belongs to (`task` calls run together).",
                ),
            ),
        ),
        Obj(
            doc="How full the model's context is.",
            fields=(
                ACTIVITY_ID,
                Field(name="kind", shape=Str(const="context")),
                Field(name="current_tokens", shape=COUNT, doc="Tokens in use."),
                Field(name="max_tokens", shape=COUNT, doc="The model's window."),
                Field(
                    name="reasoning_tokens",
                    shape=Nullable(inner=COUNT),
                    doc="Reasoning tokens, when reported.",
                ),
                Field(name="request_sequence", shape=COUNT, doc="Provider request number."),
                Field(
                    name="source",
                    shape=Str(
                        enum=(
                            "fallback_estimate",
                            "tokenizer_estimate",
                            "fallback_projection",
                            "tokenizer_projection",
                            "last_provider_usage",
                            "provider_exact",
                            "provider_partial",
                        ),
                        sources={"enum": "magi_code.turns.activity:ContextSource"},
                    ),
                    doc="How `current_tokens` was obtained.",
                ),
            ),
        ),
        Obj(
            doc="Token usage of one provider request of the main agent, or of a whole "
            "subagent task (aggregated; its requests are not reported apart).",
            fields=(
                ACTIVITY_ID,
                Field(name="kind", shape=Str(const="usage")),
                Field(name="effective_input", shape=COUNT, doc="Input tokens."),
                Field(name="output", shape=COUNT, doc="Output tokens."),
                Field(name="cache_read", shape=COUNT, doc="Input tokens read from cache."),
                Field(name="cache_known", shape=Bool(), doc="Whether `cache_read` is reported."),
                Field(name="request_sequence", shape=COUNT, doc="Provider request number."),
                Field(
                    name="final_usage",
                    shape=Bool(),
                    doc="The main agent's request whose reply is the turn's answer "
                    "(never on `subagent_aggregate`).",
                ),
                Field(
                    name="source",
                    shape=Str(
                        enum=("provider_request", "subagent_aggregate"),
                        sources={"enum": "magi_code.turns.activity:UsageSource"},
                    ),
                    doc="What was counted.",
                ),
            ),
        ),
        Obj(
            doc="The history is being summarized to fit the context.",
            fields=(
                ACTIVITY_ID,
                Field(name="kind", shape=Str(const="compaction")),
                Field(
                    name="status",
                    shape=Str(
                        enum=("triggered", "running", "completed", "failed", "cancelled"),
                        sources={"enum": "magi_code.turns.activity:CompactionStatus"},
                    ),
                    doc="`triggered` → `running` → an end state.",
                ),
                Field(
                    name="current_tokens",
                    shape=Nullable(inner=COUNT),
                    doc="Tokens before (`triggered`) or after (`completed`); else `null`.",
                ),
                Field(
                    name="max_tokens",
                    shape=Nullable(inner=COUNT),
                    doc="The window (`triggered`, `completed`); else `null`.",
                ),
                Field(
                    name="replay_required",
                    shape=Bool(),
                    doc="`true` once it ended: replay the session to see the new history.",
                ),
            ),
        ),
        Obj(
            doc="A reasoning summary the provider marked as such.",
            fields=(
                ACTIVITY_ID,
                Field(name="kind", shape=Str(const="reasoning_summary")),
                Field(
                    name="text",
                    shape=Str(max_bytes=MAX_SUMMARY_BYTES),
                    doc="Sanitized summary, at most 2,048 bytes (empty when the input was "
                    "over 16,384 bytes).",
                ),
                Field(name="redacted", shape=Bool(), doc="Something was removed."),
                Field(name="truncated", shape=Bool(), doc="The text was cut."),
            ),
        ),
    ),
)
LOGIN_ID: Final = Field(name="login_id", shape=OPAQUE_ID, doc="The login attempt.")
LOGIN_PROVIDER: Final = Field(
    name="provider_id", shape=Str(const="openai-codex"), doc="Always `openai-codex`."
)
LOGIN_TERMINAL_STATES: Final = (
    "exchange_succeeded",
    "cancelled",
    "callback_timeout",
    "callback_failed",
    "exchange_failed",
    "auth_changed",
    "storage_failed",
    "internal_error",
)


def _progress(state: str, doc: str, *extra: Field) -> Obj:
    return Obj(
        doc=doc,
        fields=(LOGIN_ID, LOGIN_PROVIDER, Field(name="state", shape=Str(const=state)), *extra),
    )


LOGIN_PROGRESS: Final = Union(
    tag="state",
    doc="The step the login reached.",
    variants=(
        _progress(
            "authorization_url",
            "Open this URL in a browser to sign in.",
            Field(
                name="url",
                shape=Str(max_bytes=2048, format="uri"),
                doc="The authorization URL (at most 2,048 bytes).",
            ),
            Field(
                name="open_browser",
                shape=Bool(const=True),
                doc="Always `true`: the client should open it; the service never does.",
            ),
        ),
        _progress(
            "waiting", "Waiting (up to five minutes) for the browser redirect or a pasted callback."
        ),
        _progress("callback_received", "A callback arrived; it is being checked."),
        _progress("callback_accepted", "The callback was valid; exchanging the code."),
    ),
)

# Why a turn failed, in the order of the table in ``docs/turns.md``.
FAILURE_LABELS: Final = (
    "auth_missing",
    "auth_refresh_failed",
    "auth_unreadable",
    "provider_not_configured",
    "configuration_unavailable",
    "provider_auth_failed",
    "provider_http_error",
    "provider_server_error",
    "provider_rate_limited",
    "provider_quota_exceeded",
    "provider_unavailable",
    "provider_timeout",
    "provider_stream_error",
    "provider_incomplete",
    "context_length_exceeded",
    "sandbox_unavailable",
    "output_limit_exceeded",
    "request_limit_exceeded",
    "service_interrupted",
    "storage_error",
    "internal_error",
)

EVENTS: Final[tuple[Event, ...]] = (
    Event(
        name="turn.started",
        service="turns",
        stream="turn",
        summary="The turn was accepted (directly after its `turn.start` response).",
        payload=Obj(
            fields=(
                TURN_ID,
                Field(name="session_id", shape=SESSION_ID, doc="The turn's session."),
                Field(name="status", shape=Str(const="started"), doc="Always `started`."),
                Field(name="sequence", shape=Int(const=0), doc="Always 0."),
            )
        ),
    ),
    Event(
        name="turn.assistant_delta",
        service="turns",
        stream="turn",
        summary="The next piece of the assistant's text.",
        payload=Obj(
            fields=(
                TURN_ID,
                Field(name="sequence", shape=Int(minimum=1), doc="The turn's next sequence."),
                Field(
                    name="text",
                    shape=Str(
                        max_bytes=8192,
                        sources={"max_bytes": "magi_code.core.turns:MAX_DELTA_BYTES"},
                    ),
                    doc="Text to append (at most 8,192 bytes).",
                ),
            )
        ),
    ),
    Event(
        name="turn.activity",
        service="turns",
        stream="turn",
        summary="Something the agent did (tool call, context, usage, compaction, ...).",
        payload=Obj(
            fields=(
                TURN_ID,
                Field(name="sequence", shape=Int(minimum=1), doc="The turn's next sequence."),
                Field(name="activity", shape=ACTIVITY, doc="What happened."),
            )
        ),
    ),
    Event(
        name="turn.terminal",
        service="turns",
        stream="turn",
        summary="The turn ended; always the turn's last event.",
        payload=Obj(
            fields=(
                TURN_ID,
                Field(name="session_id", shape=SESSION_ID, doc="The turn's session."),
                Field(
                    name="status",
                    shape=Str(enum=("completed", "cancelled", "failed")),
                    doc="How the turn ended.",
                ),
                Field(
                    name="assistant_text",
                    shape=Str(),
                    doc="All accepted assistant text: the deltas joined.",
                ),
                Field(name="sequence", shape=Int(minimum=1), doc="The turn's last sequence."),
                Field(
                    name="activity_dropped",
                    shape=COUNT,
                    doc="Activity events not sent (their sequence numbers are skipped).",
                ),
                Field(
                    name="activity_replay_available",
                    shape=Bool(const=False),
                    doc="Always `false`.",
                ),
                Field(
                    name="replay_required",
                    shape=Bool(const=True),
                    doc="Always `true`: `session.replay` shows the durable result.",
                ),
                Field(
                    name="failure",
                    shape=Str(
                        enum=FAILURE_LABELS,
                        fallback="a failure this version does not label: show `remedy`",
                        sources={"enum": "magi_code.turns.failures:LABELS"},
                    ),
                    required=False,
                    doc="Only when `status` is `failed`: why, as a fixed label (the table in "
                    "`docs/turns.md`). Absent on other terminals.",
                ),
                Field(
                    name="remedy",
                    shape=Str(
                        min_length=1,
                        max_bytes=512,
                        sources={"max_bytes": "magi_code.turns.failures:MAX_REMEDY_BYTES"},
                    ),
                    required=False,
                    doc="With `failure`, always: what to do, one line of fixed text for "
                    "people (it may name a provider's key variable).",
                ),
            )
        ),
    ),
    Event(
        name="auth.login.progress",
        service="auth",
        stream="login",
        summary="The login reached a new step.",
        payload=LOGIN_PROGRESS,
    ),
    Event(
        name="auth.login.terminal",
        service="auth",
        stream="login",
        summary="The login ended; always its last event.",
        payload=Obj(
            fields=(
                LOGIN_ID,
                LOGIN_PROVIDER,
                Field(
                    name="state",
                    shape=Str(
                        enum=LOGIN_TERMINAL_STATES,
                        sources={"enum": "magi_code.auth.login:TERMINAL_STATES"},
                    ),
                    doc="`exchange_succeeded` means signed in; every other value is a "
                    "failure or cancellation.",
                ),
                Field(
                    name="cleanup_complete",
                    shape=Bool(const=True),
                    doc="Always `true`: the callback listener is closed.",
                ),
            )
        ),
    ),
)


ERROR_DOCS: Final[Mapping[ErrorCode, str]] = {
    E.INVALID_JSON: "a record is blank, not JSON, or not UTF-8 (uncorrelated)",
    E.RECORD_TOO_LARGE: "a record is over 65,536 bytes with its newline; it is discarded "
    "through its newline (uncorrelated)",
    E.INVALID_REQUEST: "the record is not an object (uncorrelated), or the envelope is "
    "wrong: unknown member, `kind` not `request`, missing or invalid `request_id`/`method`, "
    "missing `payload`, non-integer `protocol_version`, or an outer `session_id` on a method "
    "that takes none",
    E.PAYLOAD_TOO_LARGE: "the compact `payload` is over 32,768 bytes",
    E.LIMIT_EXCEEDED: "a structural bound is broken (depth 32, 64 items, 64 members, "
    "16,384-byte strings), an ID or method is too long, or an operation bound (page size, "
    "negotiation lists, 16 attachments, the `session.list` scan budget)",
    E.UNSUPPORTED_VERSION: "`protocol_version` is an integer other than 1, or `initialize` "
    "offers no version 1",
    E.UNSUPPORTED_CAPABILITY: "`initialize` requests an operation this service does not advertise",
    E.UNSUPPORTED_OPERATION: "the method is unknown, or not a well-formed name",
    E.NOT_INITIALIZED: "any gated operation before a successful `initialize`",
    E.INVALID_PAYLOAD: "the payload does not fit the operation (unknown member, missing "
    "member, wrong type, value out of range)",
    E.DUPLICATE_REQUEST_ID: "the `request_id` is still reserved by a request in flight (the "
    "original is unaffected)",
    E.TOO_MANY_ACTIVE_TURNS: "`turn.start` while this client already runs 16 turns",
    E.SESSION_BUSY: "the session is held by another client or process, runs a turn, is "
    "closing, or its history is locked",
    E.SESSION_UNAVAILABLE: "the session does not exist or cannot be read or written",
    E.INVALID_SESSION_ID: "a session ID is missing where required or breaks the session ID rule",
    E.UNKNOWN_TURN: "`turn.cancel` names no running turn of this client",
    E.AUTH_BUSY: "a second login, or a second callback for one login",
    E.UNKNOWN_LOGIN: "a callback or cancel names no active login",
    E.PROVIDER_UNAVAILABLE: "the provider has no interactive login, or logout names an "
    "unknown provider",
    E.CONFIRMATION_REQUIRED: "`auth.logout` without `confirmed: true`",
    E.CONFIGURATION_UNAVAILABLE: "settings cannot be read, or `MC_PROVIDER`/`MC_MODEL` is unsafe",
    E.CONFIGURATION_BUSY: "another catalog/config request of this client is running, the "
    "same file is being written, or a write or a persistent client's turn start meets a "
    "turn's settings capture",
    E.CATALOG_REFRESH_FAILED: "discovery failed or found nothing usable, or the cache could "
    "not be written",
    E.SETTINGS_WRITE_FAILED: "a settings write could not be locked, validated or persisted",
    E.INVALID_SCOPE: "`config.set` with an unknown scope, or `fast` with `project`",
    E.INVALID_SELECTION: "an unsafe, unknown or disabled provider or model",
    E.UNSUPPORTED_REASONING: "the target model does not offer the reasoning level",
    E.CATALOG_UNAVAILABLE: "a selection or reasoning change needs a usable catalog",
    E.CATALOG_STALE: "a selection or reasoning change needs a fresh catalog",
    E.INTERNAL_ERROR: "an unexpected failure, or settings/credentials unreadable for "
    "`status`, `auth.*`",
}


# -- what the declarations list of themselves ----------------------------------------------

OPERATION_NAMES: Final = tuple(op.name for op in _DECLARED)
EVENT_NAMES: Final = tuple(ev.name for ev in EVENTS)
EVENT_ENVELOPE: Final = Obj(
    doc="Something that happened in a turn or a login, after its start response.",
    fields=(
        Field(name="protocol_version", shape=VERSION, doc="Always 1."),
        Field(name="kind", shape=Str(const="event"), doc="Always `event`."),
        Field(
            name="event_id",
            shape=EVENT_ID,
            doc="`evt-<n>`: unique among the events of one service process.",
        ),
        Field(
            name="request_id",
            shape=Nullable(inner=OPAQUE_ID),
            doc="The ID of the request that started the turn or login.",
        ),
        Field(
            name="session_id",
            shape=Nullable(inner=OPAQUE_ID),
            doc="The turn's session; `null` for login events.",
        ),
        Field(name="event", shape=Str(enum=EVENT_NAMES), doc="The event name."),
        Field(name="payload", shape=PAYLOAD, doc="The event's data."),
    ),
)
CAPABILITIES: Final = Obj(
    fields=(
        Field(
            name="protocol_versions",
            shape=Arr(items=Int(const=PROTOCOL_VERSION), const=(PROTOCOL_VERSION,)),
            doc="Always `[1]`.",
        ),
        Field(
            name="operations",
            shape=Arr(
                items=Str(
                    enum=OPERATION_NAMES,
                    max_bytes=MAX_NAME_BYTES,
                    fallback="an operation this client does not know (left unused)",
                )
            ),
            doc=f"Every operation this service answers (all {len(OPERATION_NAMES)}).",
        ),
        Field(
            name="events",
            shape=Arr(items=Str(enum=EVENT_NAMES)),
            doc=f"Every event this service sends (all {len(EVENT_NAMES)}); a client that "
            "cannot handle one of them must not go on.",
        ),
        Field(
            name="transports",
            shape=Arr(
                items=Str(enum=TRANSPORTS),
                min_items=1,
                consumer=Arr(items=TRANSPORT_NAME, min_items=1, contains="stdio"),
            ),
            doc='`["stdio"]` for `--app service`.',
        ),
        Field(name="limits", shape=LIMITS, doc="The same object as `initialize.limits`."),
        Field(name="activity", shape=ACTIVITY_CAPABILITIES, doc="Activity reporting."),
    )
)


def _advertising(op: Operation) -> Operation:
    """``op`` with ``CAPABILITIES`` in its response where it stands."""
    if op.response is _CAPABILITIES_SLOT:
        return dataclasses.replace(op, response=CAPABILITIES)
    fields = tuple(
        dataclasses.replace(f, shape=CAPABILITIES) if f.shape is _CAPABILITIES_SLOT else f
        for f in op.response.fields
    )
    return dataclasses.replace(op, response=dataclasses.replace(op.response, fields=fields))


OPERATIONS: Final = tuple(_advertising(op) for op in _DECLARED)


def operation(name: str) -> Operation:
    return next(op for op in OPERATIONS if op.name == name)


def event(name: str) -> Event:
    return next(ev for ev in EVENTS if ev.name == name)
