"""History lines for the window tests: a header and tool turns."""

from __future__ import annotations

from magi_code.sessions.records import encode_record

SESSION = "sess_0123456789abcdef01234567"
TS = "2026-01-01T00:00:00.000Z"
HEADER = encode_record({"type": "header", "session_id": SESSION, "created_at": TS}, 0, TS)


def turn(seq: int, turn_id: str, text: str = "a reply") -> list[bytes]:
    """One tool turn's five lines, from ``seq`` on."""
    call = {"turn_id": turn_id, "call_id": f"call_{turn_id}", "name": "read_file"}
    fields: list[dict[str, object]] = [
        {"type": "user", "turn_id": turn_id, "text": "a prompt"},
        {"type": "tool_call", **call, "arguments": "{}"},
        {"type": "tool_result", **call, "output": "contents", "is_error": False},
        {"type": "assistant", "turn_id": turn_id, "text": text},
        {"type": "terminal", "turn_id": turn_id, "status": "completed", "assistant_text": text},
    ]
    return [encode_record(record, seq + n, TS) for n, record in enumerate(fields)]
