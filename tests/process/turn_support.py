"""Shared pieces of the process-level turn tests: provider settings, turn helpers, and
strict validators for the turn event stream and every ``turn.activity`` shape (v1 spec
"Structured activity" and "Turn completion and ordering")."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magi_code.auth.store import AuthStore
from magi_code.auth.tokens import codex_record
from tests.support.fake_oauth import unsigned_jwt
from tests.support.fake_providers import (
    SECRET_PROVIDER_TEXT,
    FakeProviderServer,
    FakeToolCall,
    Reply,
)
from tests.support.service import ServiceProcess


def held_shell(project: Path) -> tuple[Path, Path, str]:
    """``(started, release, command)``: a shell command that touches ``started`` and then
    waits until the test creates ``release``."""
    started, release = project / "started", project / "release"
    return started, release, f"touch {started}; while [ ! -e {release} ]; do sleep 0.05; done"


APIS = ("openai-chat", "anthropic", "openai-responses")
CODEX_ACCESS_CLAIMS = {"https://api.openai.com/auth": {"chatgpt_account_id": "acct-fake-1"}}

_HASHED_ID = re.compile(r"^[a-z][a-z0-9-]*:[0-9a-f]{64}$")
_LIFECYCLE_STATUS = {"queued", "running", "writing", "completed", "failed", "cancelled"}
_LIFECYCLE_START = {
    "tool",
    "hook",
    "context_injection",
    "subagent_batch",
    "subagent_task",
    "assistant",
    "diagnostic",
    "compaction",
}
_CONTEXT_SOURCES = {
    "fallback_estimate",
    "tokenizer_estimate",
    "fallback_projection",
    "tokenizer_projection",
    "last_provider_usage",
    "provider_exact",
    "provider_partial",
}
_COMPACTION_STATUS = {"triggered", "running", "completed", "failed", "cancelled"}


def base_url_for(fake: FakeProviderServer, api: str) -> str:
    # The Anthropic client appends /v1/messages itself; the other two take a /v1 base.
    return fake.base_url if api == "anthropic" else f"{fake.base_url}/v1"


def write_settings(
    home: Path,
    fake: FakeProviderServer,
    api: str = "openai-chat",
    *,
    context_window: int | None = None,
    **extra: Any,
) -> None:
    provider: dict[str, Any] = {"api": api, "base_url": base_url_for(fake, api)}
    if context_window is not None:
        provider["context_window"] = context_window
    doc = {"provider": "local", "model": "m1", "providers": {"local": provider}, **extra}
    (home / "settings.json").write_text(json.dumps(doc))


def builtin_env(home: Path, fake: FakeProviderServer, api: str) -> dict[str, str]:
    """Settings + env selecting the built-in provider speaking ``api``."""
    if api == "anthropic":
        (home / "settings.json").write_text(
            json.dumps({"provider": "anthropic", "model": "claude-x"})
        )
        return {"ANTHROPIC_API_KEY": "sk-ant-test-key-0000", "ANTHROPIC_BASE_URL": fake.base_url}
    if api == "openai-responses":
        (home / "settings.json").write_text(
            json.dumps({"provider": "openai-codex", "model": "gpt-x"})
        )
        access = unsigned_jwt({"exp": int(time.time()) + 3600, **CODEX_ACCESS_CLAIMS})
        record = codex_record(
            {"access_token": access, "refresh_token": "refresh-fake", "expires_in": 3600},
            time.time(),
        )
        assert record is not None
        AuthStore(home / "auth.json").commit("openai-codex", record, None)
        return {"MC_CODEX_BASE_URL": f"{fake.base_url}/v1"}
    write_settings(home, fake, api)
    return {}


async def start_turn(
    svc: ServiceProcess,
    prompt: str,
    *,
    session_id: str | None = None,
    request_id: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Send ``turn.start``; returns (request ID, accepted payload)."""
    rid = request_id or svc.next_id("turn")
    response = await svc.request(
        "turn.start", {"prompt": prompt, "options": {}}, session_id=session_id, request_id=rid
    )
    assert response["error"] is None, response
    payload = response["payload"]
    assert payload["status"] == "accepted"
    assert response["session_id"] == payload["session_id"]
    return rid, payload


@dataclass
class TurnEvents:
    events: list[dict[str, Any]]
    deltas: list[dict[str, Any]]
    activities: list[dict[str, Any]]  # the ``activity`` objects, in order
    terminal: dict[str, Any]

    @property
    def text(self) -> str:
        return "".join(d["text"] for d in self.deltas)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [a for a in self.activities if a["kind"] == kind]

    @property
    def missing_sequences(self) -> int:
        last: int = self.terminal["sequence"] - 1
        return last - len(self.deltas) - len(self.activities)


def check_turn(events: Sequence[dict[str, Any]], turn_id: str, session_id: str) -> TurnEvents:
    """Validate one turn's event stream (started → ordered progress → one terminal)."""
    assert events, "no events"
    for event in events:
        assert event["kind"] == "event"
        assert event["session_id"] == session_id
        assert set(event) == {
            "protocol_version",
            "kind",
            "event_id",
            "request_id",
            "session_id",
            "event",
            "payload",
        }
    started = events[0]
    assert started["event"] == "turn.started"
    assert started["payload"] == {
        "turn_id": turn_id,
        "session_id": session_id,
        "status": "started",
        "sequence": 0,
    }
    terminal_event = events[-1]
    assert terminal_event["event"] == "turn.terminal"
    assert [e["event"] for e in events].count("turn.terminal") == 1
    assert [e["event"] for e in events].count("turn.started") == 1
    deltas: list[dict[str, Any]] = []
    activities: list[dict[str, Any]] = []
    last = 0
    for event in events[1:-1]:
        payload = event["payload"]
        assert payload["turn_id"] == turn_id
        assert isinstance(payload["sequence"], int) and payload["sequence"] > last, events
        last = payload["sequence"]
        if event["event"] == "turn.assistant_delta":
            assert set(payload) == {"turn_id", "sequence", "text"}
            assert isinstance(payload["text"], str)
            deltas.append(payload)
        else:
            assert event["event"] == "turn.activity", event
            assert set(payload) == {"turn_id", "sequence", "activity"}
            check_activity(payload["activity"])
            activities.append(payload["activity"])
    terminal = terminal_event["payload"]
    # A failed turn's says why (label and remedy); no other terminal has either.
    why = {"failure", "remedy"} if terminal.get("status") == "failed" else set()
    assert set(terminal) == {
        "turn_id",
        "session_id",
        "status",
        "assistant_text",
        "sequence",
        "activity_dropped",
        "activity_replay_available",
        "replay_required",
        *why,
    }
    assert terminal["turn_id"] == turn_id
    assert terminal["session_id"] == session_id
    assert terminal["status"] in ("completed", "cancelled", "failed")
    assert terminal["activity_replay_available"] is False
    assert terminal["replay_required"] is True
    assert isinstance(terminal["activity_dropped"], int) and terminal["activity_dropped"] >= 0
    assert terminal["sequence"] > last
    turn = TurnEvents(list(events), deltas, activities, terminal)
    # Every sequence is a delta, a delivered activity, or a dropped one: the terminal is
    # the next value after all of them.
    assert turn.missing_sequences == terminal["activity_dropped"]
    assert terminal["assistant_text"] == turn.text
    return turn


def _check_keys(activity: Mapping[str, Any], keys: set[str]) -> None:
    got = set(activity)
    assert got == keys, (sorted(got), sorted(keys))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_activity(activity: Mapping[str, Any]) -> None:
    """The exact v1 shape (keys, enums, nullability) of one flattened activity object."""
    assert isinstance(activity["activity_id"], str)
    assert _HASHED_ID.match(activity["activity_id"]), activity
    kind = activity["kind"]
    if kind == "lifecycle":
        keys = {"activity_id", "kind", "category", "status", "details_omitted"}
        if "parent_activity_id" in activity:
            assert _HASHED_ID.match(activity["parent_activity_id"])
            keys.add("parent_activity_id")
        _check_keys(activity, keys)
        assert activity["category"] in _LIFECYCLE_START | {"activity"}
        assert activity["status"] in _LIFECYCLE_STATUS
        assert activity["details_omitted"] is True
    elif kind == "tool":
        keys = {
            "activity_id",
            "kind",
            "tool_id",
            "tool_name",
            "server_id",
            "transport",
            "status",
            "timed_out",
            "details_omitted",
        }
        if "parent_activity_id" in activity:  # the call's subagent batch
            assert _HASHED_ID.match(activity["parent_activity_id"])
            keys.add("parent_activity_id")
        _check_keys(activity, keys)
        assert _HASHED_ID.match(activity["tool_id"])
        assert activity["tool_name"] is None or isinstance(activity["tool_name"], str)
        assert activity["server_id"] is None or _HASHED_ID.match(activity["server_id"])
        assert activity["transport"] in ("local", "mcp", "unknown")
        assert activity["status"] in _LIFECYCLE_STATUS
        assert activity["timed_out"] in (None, True, False)
        assert activity["details_omitted"] is True
    elif kind == "reasoning_summary":
        _check_keys(activity, {"activity_id", "kind", "text", "redacted", "truncated"})
        assert isinstance(activity["text"], str)
        assert len(activity["text"].encode()) <= 2048
        assert isinstance(activity["redacted"], bool)
        assert isinstance(activity["truncated"], bool)
    elif kind == "context":
        _check_keys(
            activity,
            {
                "activity_id",
                "kind",
                "current_tokens",
                "max_tokens",
                "reasoning_tokens",
                "request_sequence",
                "source",
            },
        )
        assert _count(activity["current_tokens"]) and _count(activity["max_tokens"])
        assert activity["reasoning_tokens"] is None or _count(activity["reasoning_tokens"])
        assert _count(activity["request_sequence"])
        assert activity["source"] in _CONTEXT_SOURCES
    elif kind == "usage":
        _check_keys(
            activity,
            {
                "activity_id",
                "kind",
                "effective_input",
                "output",
                "cache_read",
                "cache_known",
                "request_sequence",
                "final_usage",
                "source",
            },
        )
        for key in ("effective_input", "output", "cache_read", "request_sequence"):
            assert _count(activity[key]), key
        assert isinstance(activity["cache_known"], bool)
        assert isinstance(activity["final_usage"], bool)
        assert activity["source"] in ("provider_request", "subagent_aggregate")
    elif kind == "compaction":
        _check_keys(
            activity,
            {"activity_id", "kind", "status", "current_tokens", "max_tokens", "replay_required"},
        )
        status = activity["status"]
        assert status in _COMPACTION_STATUS
        if status in ("triggered", "completed"):
            assert _count(activity["current_tokens"]) and _count(activity["max_tokens"])
        else:
            assert activity["current_tokens"] is None and activity["max_tokens"] is None
        assert activity["replay_required"] is (status in ("completed", "failed", "cancelled"))
    else:
        raise AssertionError(f"unknown activity kind {kind!r}")


async def run_turn(
    svc: ServiceProcess, prompt: str, *, session_id: str | None = None
) -> tuple[dict[str, Any], TurnEvents]:
    rid, accepted = await start_turn(svc, prompt, session_id=session_id)
    events = await svc.events_until_terminal(rid)
    return accepted, check_turn(events, accepted["turn_id"], accepted["session_id"])


async def replay_all(svc: ServiceProcess, session_id: str) -> list[dict[str, Any]]:
    """Every replay item of the session, following pages; parts are joined per item."""
    items: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(64):
        response = await svc.request("session.replay", {"after": after}, session_id=session_id)
        assert response["error"] is None, response
        page = response["payload"]
        assert page["resync_required"] is False
        for item in page["events"]:
            if item["kind"] in ("message", "summary") and item["part"] > 0:
                items[-1]["text"] += item["text"]
            else:
                items.append(dict(item))
        after = page["next_cursor"]
        if not page["truncated"]:
            return items
    raise AssertionError("replay did not end")


async def replay_events(
    svc: ServiceProcess, session_id: str, *, after: str | None = None, limit: int = 32
) -> tuple[list[dict[str, Any]], str]:
    """The replay events after ``after`` as sent (parts apart), following pages; and the
    last page's ``next_cursor``. ``resync_required`` fails the call."""
    events: list[dict[str, Any]] = []
    for _ in range(10_000):
        payload = {"after": after, "limit": limit}
        response = await svc.request("session.replay", payload, session_id=session_id)
        assert response["error"] is None, response
        page = response["payload"]
        assert page["resync_required"] is False, page
        events += page["events"]
        after = page["next_cursor"]
        if not page["truncated"]:
            assert after is not None
            return events, after
    raise AssertionError("replay did not end")


def greedy_parts(text: str) -> list[str]:
    """``text`` in the longest parts of at most 2,048 UTF-8 bytes that end on a character."""
    parts, current, size = [], [], 0
    for ch in text:
        width = len(ch.encode())
        if size + width > 2048:
            parts.append("".join(current))
            current, size = [], 0
        current.append(ch)
        size += width
    return [*parts, "".join(current)]


def whole_messages(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Replay events with each message's (or summary's) parts joined, after checking them
    as the v1 contract has them: the whole text split at UTF-8 boundaries into parts of at
    most 2,048 bytes (each as long as the bound allows), ``part`` counting from 0 per
    message, ``last_part`` only on its last part, and no empty part but the one part of
    an empty user message."""
    shape = [
        (e["kind"], e.get("role"), e.get("part"), e.get("last_part"), len(e.get("text", "")))
        for e in events
    ]
    items: list[dict[str, Any]] = []
    parts: list[str] = []
    for event in events:
        if event["kind"] not in ("message", "summary"):
            assert not parts, f"a message without its last part: {shape}"
            items.append(dict(event))
            continue
        assert event["part"] == len(parts), f"part {event['part']} after {len(parts)}: {shape}"
        if parts:
            assert (event["kind"], event.get("role")) == (items[-1]["kind"], items[-1].get("role"))
        else:
            items.append(dict(event))
        parts.append(event["text"])
        if event["last_part"]:
            text = "".join(parts)
            assert parts == greedy_parts(text), f"not split as the whole text: {shape}"
            assert text or event.get("role") == "user", f"an empty part: {shape}"
            items[-1].update(text=text, part=0, last_part=True)
            parts = []
    assert not parts, f"a message without its last part: {shape}"
    return items


def conversation(items: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """Replay items reduced to comparable tuples."""
    out: list[tuple[str, ...]] = []
    for item in items:
        if item["kind"] == "message":
            out.append(("message", item["role"], item["text"]))
        elif item["kind"] == "terminal":
            out.append(("terminal", item["status"]))
        else:
            out.append((item["kind"], item.get("text", "")))
    return out


def assert_no_leak(text: str, *forbidden: str) -> None:
    for needle in (SECRET_PROVIDER_TEXT, "127.0.0.1", "http://", *forbidden):
        assert needle not in text, needle


def stdout_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(json.dumps(m) for m in messages)


async def read_until(
    svc: ServiceProcess, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0
) -> None:
    """Read output until a message satisfies ``predicate``; everything read stays queued
    in ``svc.pending`` for later ``events_until_terminal``/``response_for`` calls."""
    if any(predicate(m) for m in svc.pending):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        message = await svc._read(max(0.1, deadline - loop.time()))
        svc.pending.append(message)
        if predicate(message):
            return


def delta_text_seen(svc: ServiceProcess, request_id: str) -> str:
    return "".join(
        m["payload"]["text"]
        for m in svc.pending
        if m["kind"] == "event"
        and m["request_id"] == request_id
        and m["event"] == "turn.assistant_delta"
    )


def tool_call(call_id: str, tool: str, **arguments: Any) -> FakeToolCall:
    """A scripted model tool call with ``arguments`` as its JSON arguments."""
    return FakeToolCall(call_id, tool, json.dumps(arguments))


def tool_reply(*calls: FakeToolCall) -> Reply:
    """A scripted model reply made of tool calls only."""
    return Reply(text=[], tool_calls=calls)


def strings_in(value: object) -> list[str]:
    """Every string anywhere in a JSON-like value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def posted_bodies(fake: FakeProviderServer) -> list[Any]:
    """The JSON bodies of every POST the fake provider received."""
    return [r.json for r in fake.requests if r.method == "POST"]


def body_text(body: object) -> str:
    """Every string of ``body``, one a line (to search a request body for text)."""
    return "\n".join(strings_in(body))
