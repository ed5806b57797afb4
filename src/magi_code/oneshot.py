"""``magi-code --prompt TEXT``: one turn through the same core, text streamed to stdout.

A terminal user's quickest provider check. It drives the coordinator in-process exactly as
a frontend would (initialize, then ``turn.start``), prints the session ID on stderr and the
assistant deltas on stdout as they arrive, and exits non-zero with one line (the failure
label and its remedy) when the turn does not complete. With ``--json`` stdout has the
turn's v1 events as JSONL instead, and nothing else (stderr is the same).
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
from magi_code.core.output import Batch
from magi_code.protocol import envelope
from magi_code.storage.launch import LaunchContext
from magi_code.turns.failures import describe


def _record(request_id: str, method: str, payload: dict[str, Any], session: str | None) -> bytes:
    return orjson.dumps(envelope.request(request_id, method, payload, session))


async def _batch(conn: Connection) -> Batch:
    batch = await conn.output.get()
    if batch is None:
        raise EOFError
    batch.written()
    return batch


class _Printer:
    """Text mode: deltas on stdout, one line per outcome on stderr. JSON mode: each v1
    event of the turn as one JSONL line on stdout (the records a frontend reads)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.open_line = False  # text printed without a final newline

    def batch(self, batch: Batch) -> int | None:
        """Print what the batch carries; an exit code once the run is over."""
        for message in batch.messages:
            code = self._message(message)
            if code is not None:
                return code
        return None

    def _message(self, message: dict[str, Any]) -> int | None:
        if message["kind"] == "response":
            if message["error"] is not None:
                sys.stderr.write(f"magi-code: {message['error']['message']}\n")
                return 1
            if message["request_id"] == "turn":
                sys.stderr.write(f"magi-code: session {message['payload']['session_id']}\n")
            return None
        if message["kind"] != "event":
            return None
        if self.as_json and message["request_id"] == "turn":
            # The turn's events (they carry its request ID).
            sys.stdout.write(orjson.dumps(message).decode() + "\n")
            sys.stdout.flush()
        if message["event"] == "turn.assistant_delta" and not self.as_json:
            text = message["payload"]["text"]
            sys.stdout.write(text)
            sys.stdout.flush()
            self.open_line = not text.endswith("\n") if text else self.open_line
        elif message["event"] == "turn.terminal":
            self.end_line()
            payload = message["payload"]
            if payload["status"] == "completed":
                return 0
            label = payload.get("failure")
            if label is not None:
                line = describe(payload["turn_id"], label, payload["remedy"])
                sys.stderr.write(f"magi-code: {line}\n")
            else:
                sys.stderr.write(f"magi-code: the turn ended {payload['status']}\n")
            return 1
        return None

    def end_line(self) -> None:
        if self.open_line and not self.as_json:
            sys.stdout.write("\n")
            sys.stdout.flush()
        self.open_line = False


async def run_prompt(
    ctx: LaunchContext, prompt: str, session_id: str | None, *, as_json: bool = False
) -> int:
    coordinator = await build_coordinator(ctx)
    conn = coordinator.open_connection(ctx)
    interrupted = asyncio.Event()
    printer = _Printer(as_json)
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        init = {"supported_protocol_versions": [1]}
        await coordinator.handle_record(conn, _record("init", "initialize", init, None))
        await _batch(conn)
        start = {"prompt": prompt}
        await coordinator.handle_record(conn, _record("turn", "turn.start", start, session_id))
        while True:
            reader = asyncio.ensure_future(_batch(conn))
            waiter = asyncio.ensure_future(interrupted.wait())
            await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not reader.done():
                # Ctrl-C: closing the connection cancels the turn and persists it.
                reader.cancel()
                printer.end_line()
                sys.stderr.write("magi-code: interrupted; the turn was cancelled\n")
                return 130
            code = printer.batch(reader.result())
            if code is not None:
                return code
    finally:
        conn.output.close()
        await coordinator.close_connection(conn)
