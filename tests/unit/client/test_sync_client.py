"""SyncClient: the async client driven from plain threads, against a scripted daemon."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import deque
from typing import Any

import pytest

from magi_code.client import Channel, Client, DaemonError, DaemonUnavailable, Overloaded, SyncClient
from magi_code.protocol.frames import FrameDecoder, encode_frame
from tests.unit.client.peer import CTX, WELCOME, event, message


class ThreadPeer:
    """A blocking scripted daemon for a test running without an event loop."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(20)
        self.sock = sock
        self._decoder = FrameDecoder()
        self._frames: deque[dict[str, Any]] = deque()

    def expect(self, kind: str) -> dict[str, Any]:
        while not self._frames:
            data = self.sock.recv(65536)
            assert data, f"the client closed instead of sending {kind!r}"
            self._frames.extend(self._decoder.feed(data))
        frame = self._frames.popleft()
        assert frame["t"] == kind, frame
        return frame

    def send(self, *frames: dict[str, Any]) -> None:
        self.sock.sendall(b"".join(encode_frame(f) for f in frames))


def _open(sock: socket.socket) -> SyncClient:
    async def opener() -> Client:
        # The thread's script plays the daemon's side of the handshake.
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return Client(await Channel.handshake(reader, writer, "persistent", CTX))

    return SyncClient(opener, timeout=20)


def test_sync_client_requests_snapshots_attaches_and_iterates_events() -> None:
    ours, theirs = socket.socketpair()
    peer = ThreadPeer(theirs)
    go = threading.Event()
    failures: list[BaseException] = []

    def script() -> None:
        try:
            peer.expect("hello")
            peer.send(WELCOME)
            init = peer.expect("request")
            response = {
                "protocol_version": 1,
                "kind": "response",
                "request_id": init["message"]["request_id"],
                "session_id": None,
                "method": "initialize",
                "payload": {"protocol_version": 1},
                "error": None,
            }
            peer.send(message(response))
            snap = peer.expect("snapshot")
            peer.send({"t": "snapshot_result", "id": snap["id"], "turns": [], "next_cursor": None})
            attach = peer.expect("attach")
            peer.send(
                {
                    "t": "attach_result",
                    "id": attach["id"],
                    "status": "attached",
                    "events": [],
                    "more": True,
                },
                {
                    "t": "attach_more",
                    "id": attach["id"],
                    "events": [event("t-1", 0)],
                    "more": False,
                },
            )
            grant = peer.expect("take_control")
            peer.send({"t": "grant_error", "id": grant["id"], "code": "session_busy"})
            assert go.wait(20)
            peer.send(
                message(event("t-1", 1)), {"t": "overloaded", "turn_id": "t-1", "after_sequence": 1}
            )
            theirs.shutdown(socket.SHUT_RDWR)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=script)
    thread.start()
    try:
        with _open(ours) as client:
            assert client.welcome["server_name"] == "magi-code"
            init = client.request("initialize", {"supported_protocol_versions": [1]})
            assert init["payload"] == {"protocol_version": 1}
            assert client.snapshot() == []
            attached = client.attach("t-1", -1)
            assert attached["events"] == [event("t-1", 0)]
            with pytest.raises(DaemonError) as busy:
                client.take_control("s-1")
            assert busy.value.code == "session_busy"
            with pytest.raises(TimeoutError):
                client.next_event(timeout=0.01)  # nothing sent yet
            go.set()
            seen = list(client.events(timeout=20))
            assert seen == [event("t-1", 1), Overloaded("t-1", 1)]
        with pytest.raises(DaemonUnavailable):
            client.request("session.list")  # closed
        client.close()  # idempotent
    finally:
        go.set()
        thread.join(20)
        theirs.close()
    assert not failures, failures


def test_a_failing_opener_stops_the_loop_thread_and_raises() -> None:
    # Its own loop thread, found by identity: other tests' threads may end meanwhile.
    started: list[threading.Thread] = []

    async def opener() -> Client:
        started.append(threading.current_thread())
        raise DaemonUnavailable("no daemon is running")

    with pytest.raises(DaemonUnavailable):
        SyncClient(opener)
    assert [t.name for t in started] == ["magi-code-client"]
    assert not started[0].is_alive()
