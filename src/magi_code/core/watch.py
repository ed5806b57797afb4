"""Session watchers (RFC-0002 §6.9): connections that observe every turn of a session.

A watcher is told what happens on a session, whoever does it: each turn's events (from
``turn.started`` to ``turn.terminal``) and *session events* (``turn_started`` with the
starting connection's label and prompt, ``control_changed``, ``control_requested``,
``approval_requested``, ``approval_resolved``, ``queue_changed``, ``title_changed``).
Watchers only read.

The hand-off from durable history to live events is per turn: a turn is delivered
either as history items (``session.replay``'s) or live, from its ``turn.started``, never
both. :meth:`SessionWatch.add` registers the sink before history is read, and the turns
delivered live since then (those running at registration included) are cut off the tail
of the history it answers with, as is a last turn with no terminal record (it is running
elsewhere or was interrupted; it arrives live if it runs here).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol

from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.sessions.projection import History, HistoryItem

from .output import TurnEvent

MAX_WATCHERS_PER_SESSION: Final = 64
MAX_WATCHED_SESSIONS: Final = 64  # per connection
# History in one watch answer; a longer one is paged with ``session.replay`` first.
MAX_WATCH_HISTORY_ITEMS: Final = 1024


class StaleCursor(Exception):
    """The watch's cursor does not match the session's history (resync)."""


class WatchSink(Protocol):
    """What a watching connection is handed (it bounds and sends)."""

    live: set[str]  # turns whose ``turn.started`` it was handed

    def turn(self, event: TurnEvent) -> None: ...

    def session(self, event: dict[str, Any]) -> None: ...


class SessionWatch:
    def __init__(self) -> None:
        self._sinks: dict[str, dict[int, WatchSink]] = {}

    def add(self, session_id: str, conn_id: int, sink: WatchSink) -> None:
        """Raises ServiceError ``limit_exceeded`` past either bound."""
        sinks = self._sinks.get(session_id, {})
        if conn_id in sinks:
            return
        watched = sum(1 for s in self._sinks.values() if conn_id in s)
        if len(sinks) >= MAX_WATCHERS_PER_SESSION or watched >= MAX_WATCHED_SESSIONS:
            raise ServiceError(ErrorCode.LIMIT_EXCEEDED)
        self._sinks.setdefault(session_id, {})[conn_id] = sink

    def remove(self, session_id: str, conn_id: int) -> bool:
        sinks = self._sinks.get(session_id)
        if sinks is None or sinks.pop(conn_id, None) is None:
            return False
        if not sinks:
            del self._sinks[session_id]
        return True

    def remove_all(self, conn_id: int) -> None:
        for session_id in [s for s, sinks in self._sinks.items() if conn_id in sinks]:
            self.remove(session_id, conn_id)

    def watching(self, session_id: str, conn_id: int) -> bool:
        return conn_id in self._sinks.get(session_id, {})

    def count(self) -> int:
        return sum(len(sinks) for sinks in self._sinks.values())

    def turn(self, event: TurnEvent, started: dict[str, Any] | None) -> None:
        """One turn event; ``started`` is the ``turn_started`` session event that goes
        before a ``turn.started``."""
        for sink in list(self._sinks.get(event.info.session_id, {}).values()):
            if started is not None:
                sink.live.add(event.turn_id)
                sink.session(started)
            sink.turn(event)

    def session(self, session_id: str, event: dict[str, Any]) -> None:
        for sink in list(self._sinks.get(session_id, {}).values()):
            sink.session(event)


def history_before_live(history: History, live: Iterable[str]) -> list[HistoryItem]:
    """``history`` without the turns delivered live and a last turn that has no
    terminal record (see the module docstring): a suffix is cut, so cursors hold."""
    live = set(live)
    items = history.items
    end = len(items)
    while end > 0:
        turn_id = items[end - 1].turn_id
        if turn_id is None or (turn_id not in live and turn_id in history.finished):
            break
        end -= 1
    return items[:end]
