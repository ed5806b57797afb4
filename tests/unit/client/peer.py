"""A scripted daemon for client tests: the other end of a real Unix socket pair.

The test plays the daemon frame by frame (real v2 framing from ``protocol.frames``); the
client under test is the real :class:`~magi_code.client.Client` on a real socket, with
only the connect step (path lookup, peer UID check) replaced by ``Channel.handshake``.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from magi_code.client import Channel, Client, LaunchContext
from magi_code.protocol.frames import FrameDecoder, encode_frame

CTX = LaunchContext(Path("/home/user/.magi-code"), Path("/work/project"), {"LANG": "C"})
WELCOME: dict[str, Any] = {
    "t": "welcome",
    "protocol_version": 2,
    "server_name": "magi-code",
    "server_version": "test",
    "instance_id": "i-1",
    "pid": 1,
    "role": "persistent",
    "lifetime": "persistent",
    "limits": {},
    "capabilities": [],
}


class Peer:
    """The daemon's end: receive the client's frames, send scripted ones."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._decoder = FrameDecoder()
        self._frames: deque[dict[str, Any]] = deque()

    async def recv(self) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        while not self._frames:
            data = await loop.sock_recv(self.sock, 65536)
            if not data:
                return None
            self._frames.extend(self._decoder.feed(data))
        return self._frames.popleft()

    async def expect(self, kind: str) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.recv(), 10)
        assert frame is not None, f"the client closed instead of sending {kind!r}"
        assert frame["t"] == kind, frame
        return frame

    async def send(self, *frames: dict[str, Any]) -> None:
        data = b"".join(encode_frame(f) for f in frames)
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def respond(self, frame: dict[str, Any], payload: dict[str, Any]) -> None:
        """Answer a ``request`` frame with a successful v1 response."""
        request = frame["message"]
        await self.send(
            message(
                {
                    "protocol_version": 1,
                    "kind": "response",
                    "request_id": request["request_id"],
                    "session_id": request.get("session_id"),
                    "method": request["method"],
                    "payload": payload,
                    "error": None,
                }
            )
        )

    def close(self) -> None:
        self.sock.close()


def message(envelope: dict[str, Any]) -> dict[str, Any]:
    return {"t": "message", "message": envelope}


def event(turn_id: str, sequence: int, name: str = "turn.assistant_delta") -> dict[str, Any]:
    payload: dict[str, Any] = {"turn_id": turn_id, "sequence": sequence}
    if name == "turn.assistant_delta":
        payload["text"] = f"<{sequence}>"
    return {
        "protocol_version": 1,
        "kind": "event",
        "event_id": f"{turn_id}-{sequence}",
        "request_id": "r-start",
        "session_id": "s-1",
        "event": name,
        "payload": payload,
    }


async def handshake(sock: socket.socket, peer: Peer, **client: Any) -> Client:
    """Open a Client on ``sock`` while ``peer`` answers its hello with ``welcome``."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)

    async def serve() -> dict[str, Any]:
        hello = await peer.expect("hello")
        await peer.send(WELCOME)
        return hello

    served = asyncio.ensure_future(serve())
    channel = await Channel.handshake(reader, writer, "persistent", CTX)
    hello = await served
    assert hello["role"] == "persistent" and hello["launch"]["project_dir"] == "/work/project"
    return Client(channel, **client)


@asynccontextmanager
async def connected(**client: Any) -> AsyncIterator[tuple[Client, Peer]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer = Peer(theirs)
    try:
        client_ = await handshake(ours, peer, **client)
        try:
            yield client_, peer
        finally:
            await client_.close()
    finally:
        peer.close()


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` (a bounded wait for a condition, not an assertion on time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not predicate():
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.001)
