"""Reading what the agent sent: the fake provider's recorded requests as plain messages,
and the session's records as written on disk (shared by the agent-loop process tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magi_code.sessions.records import Record, decode_line
from tests.support.fake_providers import FakeProviderServer, RecordedRequest


def posts(fake: FakeProviderServer) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.method == "POST"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text")
        )
    return ""


def messages(request: RecordedRequest) -> list[tuple[str, str]]:
    """``(role, text)`` of each user/assistant message of a request, in any of the three
    APIs (tool calls and results left out; a message with only those has empty text)."""
    body = request.json
    if "input" in body:  # Responses
        return [
            (item["role"], _text(item["content"]))
            for item in body["input"]
            if item.get("type") == "message"
        ]
    return [
        (message["role"], _text(message.get("content")))
        for message in body["messages"]
        if message["role"] in ("user", "assistant")
    ]


def system_text(request: RecordedRequest) -> str:
    body = request.json
    if "instructions" in body:
        return str(body["instructions"])
    if "system" in body:
        return _text(body["system"])
    return "".join(m["content"] for m in body["messages"] if m["role"] == "system")


def records(home: Path, session_id: str) -> list[Record]:
    data = (home / "sessions" / session_id / "history.jsonl").read_bytes()
    decoded = [decode_line(line) for line in data.splitlines()]
    return [record for record in decoded if record is not None]
