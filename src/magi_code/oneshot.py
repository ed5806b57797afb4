"""``magi-code --prompt TEXT``: one turn through the same core, text streamed to stdout.

A terminal user's quickest provider check. It drives the coordinator in-process exactly as
a frontend would (initialize, then ``turn.start``), prints assistant deltas as they
arrive, and exits non-zero with a one-line reason when the turn does not complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

import orjson

from magi_code.composition import build_coordinator
from magi_code.core.coordinator import Connection
from magi_code.protocol import envelope
from magi_code.storage.launch import LaunchContext


def _record(request_id: str, method: str, payload: dict[str, Any], session: str | None) -> bytes:
    return orjson.dumps(envelope.request(request_id, method, payload, session))


async def _messages(conn: Connection) -> list[dict[str, Any]]:
    batch = await conn.output.get()
    if batch is None:
        raise EOFError
    batch.written()
    return batch.messages


def _report(message: dict[str, Any]) -> int | None:
    """Print what the message carries; an exit code once the run is over."""
    if message["kind"] == "response" and message["error"] is not None:
        sys.stderr.write(f"magi-code: {message['error']['message']}\n")
        return 1
    if message["kind"] != "event":
        return None
    if message["event"] == "turn.assistant_delta":
        sys.stdout.write(message["payload"]["text"])
        sys.stdout.flush()
    elif message["event"] == "turn.terminal":
        sys.stdout.write("\n")
        status = message["payload"]["status"]
        if status == "completed":
            return 0
        sys.stderr.write(f"magi-code: the turn {status} (session {message['session_id']})\n")
        return 1
    return None


async def run_prompt(ctx: LaunchContext, prompt: str, session_id: str | None) -> int:
    coordinator = await build_coordinator(ctx)
    conn = coordinator.open_connection(ctx)
    interrupted = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        init = {"supported_protocol_versions": [1]}
        await coordinator.handle_record(conn, _record("init", "initialize", init, None))
        await _messages(conn)
        start = {"prompt": prompt}
        await coordinator.handle_record(conn, _record("turn", "turn.start", start, session_id))
        while True:
            reader = asyncio.ensure_future(_messages(conn))
            waiter = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not reader.done():
                # Ctrl-C: closing the connection cancels the turn and persists it.
                reader.cancel()
                sys.stderr.write("\nmagi-code: interrupted; the turn was cancelled\n")
                return 130
            for message in reader.result():
                code = _report(message)
                if code is not None:
                    return code
    finally:
        conn.output.close()
        await coordinator.close_connection(conn)
