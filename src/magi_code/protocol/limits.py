"""Advertised v1 limits. Fixed for the running process; every check uses these names."""

from __future__ import annotations

from typing import Final

PROTOCOL_VERSION: Final = 1

MAX_RECORD_BYTES: Final = 65536
MAX_PAYLOAD_BYTES: Final = 32768
MAX_ERROR_MESSAGE_BYTES: Final = 512
MAX_ID_BYTES: Final = 128
MAX_NAME_BYTES: Final = 64
MAX_STRING_BYTES: Final = 16384
MAX_JSON_DEPTH: Final = 32
MAX_ARRAY_ITEMS: Final = 64
MAX_OBJECT_FIELDS: Final = 64
MAX_NEGOTIATION_ITEMS: Final = 8
MAX_SESSION_ATTACHMENTS: Final = 16
MAX_SESSION_PAGE_ITEMS: Final = 32
MAX_SESSION_REPLAY_PAGE_BYTES: Final = 16384
MAX_SESSION_REPLAY_WINDOW_BYTES: Final = 2097152
MAX_SESSION_LIST_SCAN_ENTRIES: Final = 20000
MAX_CATALOG_PAGE_ITEMS: Final = 32

MAX_SUMMARY_BYTES: Final = 2048

ADVERTISED_LIMITS: Final[dict[str, int]] = {
    "max_record_bytes": MAX_RECORD_BYTES,
    "max_payload_bytes": MAX_PAYLOAD_BYTES,
    "max_error_message_bytes": MAX_ERROR_MESSAGE_BYTES,
    "max_id_bytes": MAX_ID_BYTES,
    "max_name_bytes": MAX_NAME_BYTES,
    "max_string_bytes": MAX_STRING_BYTES,
    "max_json_depth": MAX_JSON_DEPTH,
    "max_array_items": MAX_ARRAY_ITEMS,
    "max_object_fields": MAX_OBJECT_FIELDS,
    "max_negotiation_items": MAX_NEGOTIATION_ITEMS,
    "max_session_attachments": MAX_SESSION_ATTACHMENTS,
    "max_session_page_items": MAX_SESSION_PAGE_ITEMS,
    "max_session_replay_page_bytes": MAX_SESSION_REPLAY_PAGE_BYTES,
    "max_session_replay_window_bytes": MAX_SESSION_REPLAY_WINDOW_BYTES,
    "max_session_list_scan_entries": MAX_SESSION_LIST_SCAN_ENTRIES,
    "max_catalog_page_items": MAX_CATALOG_PAGE_ITEMS,
}
