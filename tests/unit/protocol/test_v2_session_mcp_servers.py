"""``mcp_servers`` of a ``request`` frame (RFC-0002 §6.13): a session's own MCP servers,
bounded in count and bytes; a definition that breaks the rules is ``request_error``
``invalid_mcp_servers`` (a fixed message, nothing of what was sent); the env values
(possibly secrets) are never in a repr."""

from __future__ import annotations

from typing import Any

import pytest

from magi_code.protocol.v2 import (
    MAX_SESSION_MCP_BYTES,
    MAX_SESSION_MCP_SERVERS,
    McpServer,
    Rejected,
    Request,
    decode,
)

MESSAGE = {"v": 1, "type": "request", "request_id": "r1", "method": "session.create", "payload": {}}


def _frame(servers: Any) -> dict[str, Any]:
    return {"t": "request", "message": MESSAGE, "mcp_servers": servers}


def test_servers_are_read_with_their_env() -> None:
    server = {"name": "gh.tools-1", "command": "/bin/srv", "args": ["-v"], "env": {"TOKEN": "s"}}
    parsed = decode(_frame([server, {"name": "b", "command": "b"}]), "persistent")
    assert isinstance(parsed, Request)
    assert parsed.mcp_servers == (
        McpServer("gh.tools-1", "/bin/srv", ("-v",), {"TOKEN": "s"}),
        McpServer("b", "b", (), {}),
    )
    assert decode(_frame([]), "persistent") == Request(MESSAGE, "r1", None, None, ())
    assert decode({"t": "request", "message": MESSAGE}, "persistent") == Request(MESSAGE, "r1")


def test_a_repr_names_the_variables_only() -> None:
    server = McpServer("s", "cmd", (), {"TOKEN": "secret-value"})
    assert "TOKEN" in repr(server) and "secret-value" not in repr(server)
    assert "secret-value" not in repr(Request(MESSAGE, "r1", mcp_servers=(server,)))


@pytest.mark.parametrize(
    "servers",
    [
        {"name": "a", "command": "c"},
        [{"name": "a", "command": "c"}] * 2,  # names are unique
        [{"name": f"s{i}", "command": "c"} for i in range(MAX_SESSION_MCP_SERVERS + 1)],
        [{"name": "a", "command": "c", "env": {"T": "x" * MAX_SESSION_MCP_BYTES}}],
        [{"name": "a b", "command": "c"}],
        [{"name": "a" * 65, "command": "c"}],
        [{"name": "a", "command": ""}],
        [{"name": "a", "command": "c\0"}],
        [{"name": "a", "command": "c", "args": "-v"}],
        [{"name": "a", "command": "c", "args": [1]}],
        [{"name": "a", "command": "c", "env": {"1X": "v"}}],
        [{"name": "a", "command": "c", "env": {"X": 1}}],
        [{"name": "a", "command": "c", "url": "https://example.invalid"}],
        ["a"],
    ],
)
def test_bad_servers_are_refused_without_running(servers: Any) -> None:
    with pytest.raises(Rejected) as rejected:
        decode(_frame(servers), "persistent")
    assert rejected.value.answer == {
        "t": "request_error",
        "request_id": "r1",
        "code": "invalid_mcp_servers",
        "message": "the MCP server definitions are invalid",
    }
