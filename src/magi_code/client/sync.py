"""A blocking wrapper over :class:`~magi_code.client.connection.Client` for scripts and
editor plug-ins that have no event loop of their own.

:class:`SyncClient` runs one asyncio event loop in a daemon background thread and hands
each call to it. Calls block the calling thread; ``timeout`` (seconds) bounds one call
and raises :class:`TimeoutError`. The event buffer's backpressure applies as in the async
client: take events (:meth:`SyncClient.events`) regularly, or answers to later requests
wait behind a full buffer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any, Literal, TypeVar

from magi_code.protocol.v2 import Role
from magi_code.storage.launch import LaunchContext

from .connection import MAX_QUEUED_EVENTS, Client
from .errors import DaemonUnavailable, OutcomeUnknown
from .types import (
    ApprovalResolved,
    AttachResult,
    ControlGranted,
    ControlStatus,
    Event,
    Grants,
    QueueEntry,
    ResponseEnvelope,
    RewindResult,
    SessionInfo,
    SessionsPage,
    SnapshotItem,
    TranscriptPage,
    WatchResult,
)

T = TypeVar("T")


class SyncClient:
    """A :class:`Client` driven from synchronous code.

    Example::

        with SyncClient.connect(LaunchContext.from_process()) as client:
            client.request("initialize", {"supported_protocol_versions": [1]})
            client.request("turn.start", {"prompt": "hi"})
            for event in client.events(timeout=120):
                if not isinstance(event, Overloaded) and event["event"] == "turn.terminal":
                    break
    """

    def __init__(
        self, opener: Callable[[], Awaitable[Client]], *, timeout: float | None = None
    ) -> None:
        """Start the loop thread and open the client with ``opener`` on it.

        :meth:`connect` is the usual way in; ``opener`` is any coroutine function that
        returns a connected :class:`Client` (it runs on the background loop).
        """
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="magi-code-client", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def open_client() -> Client:
            return await opener()

        try:
            self._client = self._run(open_client(), timeout)
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def connect(
        cls,
        ctx: LaunchContext,
        role: Role = "persistent",
        *,
        autostart: bool = True,
        client_name: str = "magi_code.client",
        delta_interval_ms: int = 0,
        max_queued_events: int = MAX_QUEUED_EVENTS,
        approvals: bool = False,
        timeout: float | None = None,
    ) -> SyncClient:
        """Like :meth:`Client.connect` (starting the daemon on demand if allowed)."""

        async def opener() -> Client:
            return await Client.connect(
                ctx,
                role,
                autostart=autostart,
                client_name=client_name,
                delta_interval_ms=delta_interval_ms,
                max_queued_events=max_queued_events,
                approvals=approvals,
            )

        return cls(opener, timeout=timeout)

    @property
    def client(self) -> Client:
        """The async client (use it only from coroutines run on this wrapper's loop)."""
        return self._client

    @property
    def welcome(self) -> dict[str, Any]:
        return self._client.welcome

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        payload: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        deadline_ms: int | None = None,
        idempotency_key: str | None = None,
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
        timeout: float | None = None,
    ) -> ResponseEnvelope:
        """:meth:`Client.request`. A ``timeout`` on ``turn.start`` leaves its outcome
        unknown: pass your own ``idempotency_key`` so you can repeat it safely."""
        call = self._client.request(
            method,
            payload,
            session_id=session_id,
            request_id=request_id,
            deadline_ms=deadline_ms,
            idempotency_key=idempotency_key,
            mcp_servers=mcp_servers,
        )
        return self._run(call, timeout)

    def resume_turn(
        self, outcome: OutcomeUnknown, *, timeout: float | None = None
    ) -> tuple[ResponseEnvelope, AttachResult | None]:
        return self._run(self._client.resume_turn(outcome), timeout)

    def snapshot(
        self,
        *,
        session_id: str | None = None,
        turn_ids: Iterable[str] | None = None,
        project_dir: str | Path | None = None,
        timeout: float | None = None,
    ) -> list[SnapshotItem]:
        call = self._client.snapshot(
            session_id=session_id, turn_ids=turn_ids, project_dir=project_dir
        )
        return self._run(call, timeout)

    def attach(
        self,
        turn_id: str,
        after_sequence: int = -1,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> AttachResult:
        return self._run(
            self._client.attach(turn_id, after_sequence, session_id=session_id), timeout
        )

    def take_control(self, session_id: str, *, timeout: float | None = None) -> ControlGranted:
        return self._run(self._client.take_control(session_id), timeout)

    def request_control(self, session_id: str, *, timeout: float | None = None) -> ControlGranted:
        """:meth:`Client.request_control` (it may wait for the controller's answer)."""
        return self._run(self._client.request_control(session_id), timeout)

    def release_control(self, session_id: str, *, timeout: float | None = None) -> None:
        self._run(self._client.release_control(session_id), timeout)

    def answer_control(self, session_id: str, grant: bool, *, timeout: float | None = None) -> None:
        self._run(self._client.answer_control(session_id, grant), timeout)

    def watch(
        self, session_id: str, after_cursor: str | None = None, *, timeout: float | None = None
    ) -> WatchResult:
        """:meth:`Client.watch`: the history; live events arrive through :meth:`events`."""
        return self._run(self._client.watch(session_id, after_cursor), timeout)

    def unwatch(self, session_id: str, *, timeout: float | None = None) -> None:
        self._run(self._client.unwatch(session_id), timeout)

    def control(self, op: str, *, timeout: float | None = None) -> dict[str, Any]:
        return self._run(self._client.control(op), timeout)

    def status(self, *, timeout: float | None = None) -> ControlStatus:
        return self._run(self._client.status(), timeout)

    def answer_approval(
        self, approval_id: str, decision: str, *, timeout: float | None = None
    ) -> ApprovalResolved:
        return self._run(self._client.answer_approval(approval_id, decision), timeout)

    def list_sessions(
        self,
        *,
        project_dir: str | None = None,
        title: str | None = None,
        archived: bool | Literal["all"] = False,
        cursor: str | None = None,
        limit: int = 32,
        timeout: float | None = None,
    ) -> SessionsPage:
        page = self._client.list_sessions(
            project_dir=project_dir, title=title, archived=archived, cursor=cursor, limit=limit
        )
        return self._run(page, timeout)

    def transcript(
        self, session_id: str, cursor: str | None = None, *, timeout: float | None = None
    ) -> TranscriptPage:
        return self._run(self._client.transcript(session_id, cursor), timeout)

    def rename_session(
        self, session_id: str, title: str, *, timeout: float | None = None
    ) -> SessionInfo:
        return self._run(self._client.rename_session(session_id, title), timeout)

    def archive_session(self, session_id: str, *, timeout: float | None = None) -> SessionInfo:
        return self._run(self._client.archive_session(session_id), timeout)

    def unarchive_session(self, session_id: str, *, timeout: float | None = None) -> SessionInfo:
        return self._run(self._client.unarchive_session(session_id), timeout)

    def fork_session(
        self, session_id: str, at_cursor: str, *, timeout: float | None = None
    ) -> SessionInfo:
        return self._run(self._client.fork_session(session_id, at_cursor), timeout)

    def rewind_session(
        self,
        session_id: str,
        at_cursor: str,
        *,
        files: bool = True,
        commit: bool = False,
        force: bool = False,
        timeout: float | None = None,
    ) -> RewindResult:
        rewind = self._client.rewind_session(
            session_id, at_cursor, files=files, commit=commit, force=force
        )
        return self._run(rewind, timeout)

    def grants_list(self, session_id: str | None = None, *, timeout: float | None = None) -> Grants:
        return self._run(self._client.grants_list(session_id), timeout)

    def grants_revoke(
        self,
        scope: str,
        kind: str,
        value: Sequence[str] | str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> Grants:
        call = self._client.grants_revoke(scope, kind, value, session_id=session_id)
        return self._run(call, timeout)

    def set_session_policy(
        self, session_id: str, policy: str | None, *, timeout: float | None = None
    ) -> str | None:
        return self._run(self._client.set_session_policy(session_id, policy), timeout)

    def steer(self, turn_id: str, text: str, *, timeout: float | None = None) -> None:
        self._run(self._client.steer(turn_id, text), timeout)

    def queue_list(self, session_id: str, *, timeout: float | None = None) -> list[QueueEntry]:
        return self._run(self._client.queue_list(session_id), timeout)

    def queue_add(self, session_id: str, text: str, *, timeout: float | None = None) -> QueueEntry:
        return self._run(self._client.queue_add(session_id, text), timeout)

    def queue_remove(
        self, session_id: str, entry_id: str, *, timeout: float | None = None
    ) -> list[QueueEntry]:
        return self._run(self._client.queue_remove(session_id, entry_id), timeout)

    def queue_move(
        self, session_id: str, entry_id: str, index: int, *, timeout: float | None = None
    ) -> list[QueueEntry]:
        return self._run(self._client.queue_move(session_id, entry_id, index), timeout)

    def queue_send_now(
        self, session_id: str, entry_id: str, *, timeout: float | None = None
    ) -> list[QueueEntry]:
        return self._run(self._client.queue_send_now(session_id, entry_id), timeout)

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, None once the connection closed cleanly; :class:`TimeoutError`
        when none arrives within ``timeout`` (no event is lost by it)."""
        self._check_open()
        future = asyncio.run_coroutine_threadsafe(self._client.next_event(timeout), self._loop)
        return _result(future)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events as they arrive; each wait is bounded by ``timeout`` (TimeoutError)."""
        while (event := self.next_event(timeout)) is not None:
            yield event

    def close(self) -> None:
        """Close the connection and stop the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            future = asyncio.run_coroutine_threadsafe(self._client.close(), self._loop)
            _result(future)
        finally:
            self._stop_loop()

    def _check_open(self) -> None:
        if self._closed:
            raise DaemonUnavailable("the client is closed")

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if self._closed:
            coro.close()
            raise DaemonUnavailable("the client is closed")

        async def bounded() -> T:
            if timeout is None:
                return await coro
            return await asyncio.wait_for(coro, timeout)

        return _result(asyncio.run_coroutine_threadsafe(bounded(), self._loop))

    def _stop_loop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_shutdown(self._loop), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _shutdown(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what still runs on the loop (an abandoned call), then its helpers."""
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()


def _result(future: concurrent.futures.Future[T]) -> T:
    """Wait for a call on the loop; an interrupt (Ctrl-C) cancels it there first."""
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise
