"""v1 turn events and ``session.replay`` items as ACP ``session/update`` payloads.

Pure functions over the v1 shapes (``docs/protocol/events.md``); nothing here talks to
the editor or the core. A turn's state (:class:`TurnView`) remembers which tool calls the
editor has been told of, so the first report of a call is a ``tool_call`` and later ones
are ``tool_call_update``. The core's tool details (RFC-0002 §6.8: title subject, raw
input, locations, a file change's old and new text) arrive beside the events, before or
after the call's first report: they join the ``tool_call``, or follow as an update.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Final

from magi_code.dataclass import dataclass, field

# ACP ``ToolKind`` of each built-in tool (``docs/tools.md``); MCP and unknown tools: other.
TOOL_KINDS: Final = {
    "read_file": "read",
    "list_files": "search",
    "grep": "search",
    "edit_file": "edit",
    "write_file": "edit",
    "shell": "execute",
    "skill": "read",
    "task": "think",
}
TOOL_TITLES: Final = {
    "read_file": "Read file",
    "list_files": "List files",
    "grep": "Search files",
    "edit_file": "Edit file",
    "write_file": "Write file",
    "shell": "Run command",
    "skill": "Load skill",
    "task": "Subagent task",
}
TOOL_STATUS: Final = {
    "queued": "pending",
    "running": "in_progress",
    "writing": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "failed",
}
# Failures that are a stop reason in ACP rather than an error.
STOP_FAILURES: Final = {
    "output_limit_exceeded": "max_tokens",
    "request_limit_exceeded": "max_turn_requests",
}
# The argument that names what a built-in tool works on, for its title.
TOOL_SUBJECTS: Final = {
    "read_file": "path",
    "list_files": "pattern",
    "grep": "pattern",
    "edit_file": "path",
    "write_file": "path",
    "shell": "command",
    "skill": "name",
    "task": "prompt",
}
MAX_TITLE_CHARS: Final = 200
# Details of calls not reported yet that a turn keeps (a subagent's are never reported).
MAX_PENDING_DETAILS: Final = 64
# The content of a replayed tool call (its output is not replayed, as it is not streamed).
REPLAYED: Final = {
    "completed": "Completed.",
    "failed": "Failed.",
    "no_result": "No result: its turn ended before it did.",
}
AUTH_FAILURES: Final = frozenset(
    {"auth_missing", "auth_refresh_failed", "auth_unreadable", "provider_auth_failed"}
)


def text_chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


@dataclass(slots=True)
class TurnView:
    """What the editor has been told of one turn."""

    turn_id: str
    cwd: Path
    last_sequence: int = 0
    tools: set[str] = field(default_factory=set)
    # Fields of calls whose details came before their first report.
    pending: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)

    def updates(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The session updates for one v1 turn event (none for repeats and ends)."""
        payload = event["payload"]
        sequence = payload.get("sequence", 0)
        if payload.get("turn_id") != self.turn_id or sequence <= self.last_sequence:
            return []  # another turn's, or seen already (an attach repeats events)
        self.last_sequence = sequence
        name = event["event"]
        if name == "turn.assistant_delta":
            return [text_chunk("agent_message_chunk", payload["text"])] if payload["text"] else []
        if name == "turn.activity":
            return self._activity(payload["activity"])
        return []

    def _activity(self, activity: dict[str, Any]) -> list[dict[str, Any]]:
        kind = activity["kind"]
        if kind == "reasoning_summary":
            text = activity["text"]
            return [text_chunk("agent_thought_chunk", text)] if text else []
        if kind == "context":
            return [
                {
                    "sessionUpdate": "usage_update",
                    "used": activity["current_tokens"],
                    "size": activity["max_tokens"],
                }
            ]
        if kind == "tool":
            return [self._tool(activity)]
        return []

    def _tool(self, activity: dict[str, Any]) -> dict[str, Any]:
        call_id = activity["activity_id"]
        status = TOOL_STATUS[activity["status"]]
        if call_id in self.tools:
            return {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}
        self.tools.add(call_id)
        name = activity["tool_name"]
        return {
            "sessionUpdate": "tool_call",
            "toolCallId": call_id,
            "title": TOOL_TITLES.get(name, "MCP tool") if name else "MCP tool",
            "kind": TOOL_KINDS.get(name, "other") if name else "other",
            "status": status,
            **self.pending.pop(call_id, {}),
        }

    def detail(self, activity_id: str, detail: dict[str, Any]) -> list[dict[str, Any]]:
        """A tool detail of this turn: an update of a reported call, else kept for it."""
        fields = self._call_fields(detail["call"]) if "call" in detail else {}
        if "diff" in detail:
            fields.update(self._diff_fields(detail["diff"]))
        if activity_id in self.tools:
            return [{"sessionUpdate": "tool_call_update", "toolCallId": activity_id, **fields}]
        self.pending.setdefault(activity_id, {}).update(fields)
        while len(self.pending) > MAX_PENDING_DETAILS:
            self.pending.popitem(last=False)
        return []

    def _call_fields(self, call: dict[str, Any]) -> dict[str, Any]:
        return call_fields(call, self.cwd)

    def _diff_fields(self, diff: dict[str, Any]) -> dict[str, Any]:
        path = str(self.cwd / diff["path"])
        if diff["truncated"]:  # a cut text is no true diff: say so instead
            content = {
                "type": "content",
                "content": {"type": "text", "text": "The change is too large to show."},
            }
        else:
            content = {
                "type": "diff",
                "path": path,
                "oldText": diff["old_text"],
                "newText": diff["new_text"],
            }
        return {"content": [content], "locations": [{"path": path}]}


def call_fields(call: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """A tool call's title, kind, raw input and locations from its detail (RFC-0002 §6.8
    ``call``), paths absolute under ``cwd``."""
    name, arguments = call["tool"], call["arguments"]
    subject = arguments.get(TOOL_SUBJECTS.get(name, ""))
    title = TOOL_TITLES.get(name, name)
    if isinstance(subject, str) and subject.strip():
        title = f"{title}: {subject.strip().splitlines()[0]}"
    fields: dict[str, Any] = {
        "title": title[:MAX_TITLE_CHARS],
        "kind": TOOL_KINDS.get(name, "other"),
        "rawInput": arguments,
    }
    if call["locations"]:
        fields["locations"] = [_location(place, cwd) for place in call["locations"]]
    return fields


def _location(place: dict[str, Any], cwd: Path) -> dict[str, Any]:
    location: dict[str, Any] = {"path": str(cwd / place["path"])}
    if "line" in place:
        location["line"] = place["line"]
    return location


def stop_reason(terminal: dict[str, Any], cancel_requested: bool) -> str | None:
    """The prompt's ``stopReason``; None for a failure that is answered as an error.

    After ``session/cancel`` the answer is ``cancelled`` whatever the turn's end (ACP
    requires it), unless it failed for a reason of its own."""
    status = terminal["status"]
    if status == "failed":
        return STOP_FAILURES.get(terminal.get("failure", ""))
    if status == "cancelled" or cancel_requested:
        return "cancelled"
    return "end_turn"


def replay_updates(item: dict[str, Any], cwd: Path) -> list[dict[str, Any]]:
    """A transcript item (RFC-0002 §6.14) as the updates ``session/load`` streams back:
    messages as chunks, a tool call as one ``tool_call`` that is already over."""
    kind = item["kind"]
    if kind == "message":
        chunk = "user_message_chunk" if item["role"] == "user" else "agent_message_chunk"
        return [text_chunk(chunk, item["text"])] if item["text"] else []
    if kind == "summary":  # what replaced the compacted history: the agent's summary
        return [text_chunk("agent_message_chunk", item["text"])] if item["text"] else []
    if kind == "tool_call":
        status = item["status"]
        return [
            {
                "sessionUpdate": "tool_call",
                "toolCallId": f"{item['turn_id']}/{item['call_id']}",
                **call_fields(item["call"], cwd),
                "status": "completed" if status == "completed" else "failed",
                "content": [
                    {"type": "content", "content": {"type": "text", "text": REPLAYED[status]}}
                ],
            }
        ]
    return []
