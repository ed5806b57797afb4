"""A small MCP stdio server speaking JSON-RPC by hand (run as a script, not imported).

It lists its tools two per page (``nextCursor``), so a client that does not follow the
cursor misses most of them. Tools: ``pid`` answers the server's process id (and the
``--tag`` it was started with), ``grow`` adds a tool ``extra<N>`` and sends
``notifications/tools/list_changed`` before it answers, ``sleep`` waits the given seconds
(calls run concurrently, each in a thread), and ``t1`` … ``t4`` exist to fill pages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

PAGE_SIZE = 2
_write = threading.Lock()
_tools_lock = threading.Lock()


def _tool(name: str, description: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties or {}}
    return {"name": name, "description": description, "inputSchema": schema}


TOOLS: list[dict[str, Any]] = [
    _tool("pid", "Report the server's process id."),
    _tool("grow", "Add a tool and announce the change."),
    _tool("sleep", "Sleep, then answer.", {"seconds": {"type": "number"}}),
    *(_tool(f"t{i}", f"Filler tool {i}.") for i in range(1, 5)),
]


def send(message: dict[str, Any]) -> None:
    line = json.dumps({"jsonrpc": "2.0", **message}) + "\n"
    with _write:
        sys.stdout.write(line)
        sys.stdout.flush()


def text_result(request_id: Any, text: str) -> None:
    send({"id": request_id, "result": {"content": [{"type": "text", "text": text}]}})


def call(request_id: Any, params: dict[str, Any], tag: str) -> None:
    name = params.get("name")
    arguments = params.get("arguments") or {}
    if name == "pid":
        text_result(request_id, f"{os.getpid()}:{tag}")
    elif name == "grow":
        with _tools_lock:
            added = f"extra{sum(1 for t in TOOLS if t['name'].startswith('extra')) + 1}"
            TOOLS.append(_tool(added, f"Added at run time ({added})."))
        send({"method": "notifications/tools/list_changed"})
        text_result(request_id, added)
    elif name == "sleep":
        time.sleep(float(arguments.get("seconds", 0)))
        text_result(request_id, "slept")
    elif isinstance(name, str) and name.startswith(("t", "extra")):
        text_result(request_id, name)
    else:
        send({"id": request_id, "error": {"code": -32602, "message": "unknown tool"}})


def list_page(request_id: Any, params: dict[str, Any] | None) -> None:
    cursor = (params or {}).get("cursor")
    start = int(cursor) if cursor else 0
    with _tools_lock:
        page = TOOLS[start : start + PAGE_SIZE]
        more = start + PAGE_SIZE < len(TOOLS)
    result: dict[str, Any] = {"tools": page}
    if more:
        result["nextCursor"] = str(start + PAGE_SIZE)
    send({"id": request_id, "result": result})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="")
    tag = parser.parse_args().tag
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method = message.get("method")
        request_id = message.get("id")
        params = message.get("params")
        if request_id is None:
            continue  # notifications (initialized, cancelled) need no answer
        if method == "initialize":
            result = {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "paged-test", "version": "1.0"},
            }
            send({"id": request_id, "result": result})
        elif method == "tools/list":
            list_page(request_id, params)
        elif method == "tools/call":
            threading.Thread(target=call, args=(request_id, params, tag), daemon=True).start()
        elif method == "ping":
            send({"id": request_id, "result": {}})
        else:
            send({"id": request_id, "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    main()
