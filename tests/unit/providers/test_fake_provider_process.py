"""The fake provider also runs as its own process (for process-level tests of magi-code)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
from provider_helpers import collect, make_request
from tests.support.fake_providers import (
    FakeToolCall,
    FakeUsage,
    Fast,
    HttpError,
    RawSSE,
    Reply,
    reply_from_json,
)

from magi_code.providers import Completed, Endpoint, TextDelta, UserText

REPO = Path(__file__).resolve().parents[3]


async def test_process_mode_prints_its_port_plays_the_script_and_records(
    tmp_path: Path, client: httpx.AsyncClient
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [{"text": ["from", " script"]}]}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.fake_providers",
        "--port",
        "0",
        "--script",
        str(script),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(10):
            announced = json.loads(await proc.stdout.readline())
        base = announced["base_url"]
        assert base == f"http://127.0.0.1:{announced['port']}"
        endpoint = Endpoint("anthropic", base, {"x-api-key": "k"})

        events = await collect(client, endpoint)
        assert [e.text for e in events if isinstance(e, TextDelta)] == ["from", " script"]

        queued = await client.post(
            base + "/__fake__/enqueue", json=[{"kind": "reply", "text": ["second"]}]
        )
        assert queued.status_code == 200
        events = await collect(client, endpoint, make_request())
        assert events[0] == TextDelta("second")
        assert events[-1] == Completed("end_turn")

        # A routed marker's replies first, then its default for every later match.
        routed = await client.post(
            base + "/__fake__/route",
            json={
                "marker": "tell me",
                "replies": [{"text": ["once"]}],
                "default": {"text": ["again"]},
            },
        )
        assert routed.status_code == 200
        for expected in ("once", "again", "again"):
            events = await collect(client, endpoint, make_request([UserText("tell me")]))
            assert events[0] == TextDelta(expected)

        recorded = (await client.get(base + "/__fake__/requests")).json()
        assert [r["path"] for r in recorded] == ["/v1/messages"] * 5
        assert recorded[0]["headers"]["x-api-key"] == "k"
        assert recorded[0]["json"]["stream"] is True
        state = (await client.get(base + "/__fake__/state")).json()
        # One connection: every request, streamed or not, reused it.
        assert state == {"pending": 0, "disconnects": 0, "connections": 1}
    finally:
        proc.terminate()
        async with asyncio.timeout(10):
            code = await proc.wait()
    assert code == 0


def test_reply_specs_in_json_build_the_same_replies_as_the_python_api() -> None:
    specs: list[dict[str, Any]] = [
        {
            "text": ["a"],
            "tool_calls": [{"call_id": "c", "name": "n", "arguments": "{}"}],
            "usage": {"input_tokens": 1, "output_tokens": 2},
            "ending": "stall",
        },
        {"kind": "http_error", "status": 429, "retry_after": "1"},
        {"kind": "fast", "count": 5},
        {"kind": "raw", "frames": ["data: [DONE]\n\n"]},
    ]
    assert [reply_from_json(spec) for spec in specs] == [
        Reply(
            text=["a"],
            tool_calls=[FakeToolCall("c", "n", "{}")],
            usage=FakeUsage(input_tokens=1, output_tokens=2),
            ending="stall",
        ),
        HttpError(429, retry_after="1"),
        Fast(5),
        RawSSE([b"data: [DONE]\n\n"]),
    ]
