"""The ``control`` role (RFC-0002 §4): ``status``, ``stop`` and ``restart``, nothing else.

A control connection is never registered with the persistent coordinator, so it never
counts as a client for idle stop. Persistent connections may send ``control`` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from magi_code.protocol import v2
from magi_code.protocol.v2 import Code

if TYPE_CHECKING:
    from .connection import PeerConnection

# ``restart`` lets running turns finish for this long before the usual owner drop.
RESTART_TURN_WAIT_SECONDS: Final = 300.0


class ControlRole:
    def __init__(self, peer: PeerConnection) -> None:
        self.peer = peer

    async def serve(self) -> None:
        self.peer.send(self.peer.server.welcome("control"))
        async for frame in self.peer.frames():
            assert isinstance(frame, v2.Control)  # the only frame of this role
            answer_control(self.peer, frame)


def answer_control(peer: PeerConnection, frame: v2.Control) -> None:
    server = peer.server
    if frame.op == "status":
        peer.send(v2.control_result(frame.id, server.status()))
    elif frame.op == "stop":
        peer.send(v2.control_result(frame.id, {"stopping": True}))
        server.request_stop("control")
    elif frame.op == "restart":
        turns = server.core.counts()["active_turns"]
        peer.send(v2.control_result(frame.id, {"restarting": True, "waiting_for_turns": turns}))
        server.request_restart(RESTART_TURN_WAIT_SECONDS)
    else:
        peer.send(v2.frame_error("control_error", frame.id, Code.UNKNOWN_OPERATION))
