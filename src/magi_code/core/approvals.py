"""Approval requests of running turns, their answers, and the grants they leave.

Transport-neutral (the daemon's persistent role drives it). A connection that negotiated
approvals *listens* (:meth:`ApprovalService.listen`) with a callback that sends one v2
frame. A request goes to every listening connection *attached* to its turn or session:
the turn's starting connection, the session's controller (a control grant moves it) and
every connection that attached to the turn; a connection that attaches or takes control
later gets every pending request of that turn or session again (:meth:`follow`,
:meth:`resend_session`). The first answer from an attached connection settles it and
every attached connection gets ``approval_resolved``; a later answer gets
``approval_already_resolved``. The deadline, and the turn's end (cancel), settle it too.
The session's watchers are told both (:attr:`ApprovalService.observe`, read-only: they
answer only if attached).

Each request is recorded in the session's history when asked (durably, before anyone
is asked) and when settled (record type ``approval``, the bounded subject only). Session
grants ("allow for this session") are stored with the session (its ``meta.json``,
``sessions.meta``), so they outlive the daemon; this service holds the grants of the
sessions whose turns it ran (read again at each turn's start) for the calls' verdicts.
A session's own policy lives here for as long as the daemon runs; project grants are the
project settings' allow rules (``config.grants``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from magi_code.config.approvals import Policy, Rules, stored_rules
from magi_code.config.grants import project_grants, revoke_project_grant
from magi_code.config.settings import load_settings
from magi_code.dataclass import dataclass, field
from magi_code.protocol import v2
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.text import truncate_utf8
from magi_code.sessions.meta import MAX_GRANTS_BYTES
from magi_code.sessions.store import SessionStore
from magi_code.storage.launch import LaunchContext
from magi_code.turns.approvals import CANCELLED, TIMED_OUT, ApprovalAsk

if TYPE_CHECKING:
    from .turns import TurnRun

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], None]
# Settled requests remembered for ``approval_already_resolved``.
MAX_SETTLED: Final = 1024
MAX_SUBJECT_BYTES: Final = 1024
# Sessions with a policy of their own (``approval_policy``) the service remembers.
MAX_SESSION_POLICIES: Final = 4096
# Sessions whose grants the service holds (the grants themselves are stored).
MAX_HELD_GRANTS: Final = 4096
DEADLINE_BY: Final = v2.APPROVAL_DEADLINE_BY
CANCELLED_BY: Final = v2.APPROVAL_TURN_ENDED_BY


class UnknownApproval(Exception):
    """No pending or recently settled request of that ID this connection may answer."""


class _TooManyGrants(Exception):
    """The session's grants with one more would not fit their bound."""


@dataclass(eq=False, slots=True)
class Pending:
    approval_id: str
    run: TurnRun
    request: ApprovalAsk
    deadline_ms: int
    future: asyncio.Future[tuple[str, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def frame(self) -> dict[str, Any]:
        request = self.request
        return v2.approval_request(
            self.approval_id,
            self.run.turn_id,
            self.run.session_id,
            request.kind,
            request.activity_id,
            request.summary,
            request.options,
            self.deadline_ms,
        )


@dataclass(slots=True)
class Listener:
    send: Send
    label: str


class ApprovalService:
    def __init__(self, store: SessionStore | None = None) -> None:
        self._pending: dict[str, Pending] = {}
        self._settled: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._listeners: dict[int, Listener] = {}
        self._followers: dict[str, set[int]] = {}
        # Where session grants are stored (None: held here only, for as long as it runs).
        self._store = store
        self._grants: OrderedDict[str, Rules] = OrderedDict()
        self._policies: dict[str, Policy] = {}
        # Session events for the session's watchers (``approval_requested``/``_resolved``).
        self.observe: Callable[[str, dict[str, Any]], None] = lambda _session, _event: None

    # -- connections -----------------------------------------------------------------------

    def listen(self, conn_id: int, send: Send, label: str) -> None:
        self._listeners[conn_id] = Listener(send, label)

    def unlisten(self, conn_id: int) -> None:
        self._listeners.pop(conn_id, None)
        for followers in self._followers.values():
            followers.discard(conn_id)

    def follow(self, conn_id: int, turn_id: str) -> None:
        """``conn_id`` attached to the turn: it gets the turn's pending requests (again)."""
        self._followers.setdefault(turn_id, set()).add(conn_id)
        for pending in list(self._pending.values()):
            if pending.run.turn_id == turn_id:
                self._send(conn_id, pending.frame())

    def resend_session(self, conn_id: int, session_id: str) -> None:
        """``conn_id`` took control of the session: its pending requests, again."""
        for pending in list(self._pending.values()):
            if pending.run.session_id == session_id:
                self._send(conn_id, pending.frame())

    def pending_events(self, session_id: str) -> list[dict[str, Any]]:
        """The session's pending requests as ``approval_requested`` session events."""
        return [
            _requested(p.frame()) for p in self._pending.values() if p.run.session_id == session_id
        ]

    def _targets(self, run: TurnRun) -> set[int]:
        attached = {run.conn.conn_id, run.attachment.owner}
        attached |= self._followers.get(run.turn_id, set())
        return {conn_id for conn_id in attached if conn_id in self._listeners}

    def _send(self, conn_id: int, frame: dict[str, Any]) -> None:
        listener = self._listeners.get(conn_id)
        if listener is not None:
            listener.send(frame)

    # -- requests and answers -----------------------------------------------------------------

    def approver(self, run: TurnRun) -> TurnApprover:
        return TurnApprover(self, run)

    async def ask(self, run: TurnRun, request: ApprovalAsk, timeout: float) -> str:
        approval_id = f"appr_{secrets.token_hex(12)}"
        deadline_ms = int((time.time() + timeout) * 1000)
        pending = Pending(approval_id, run, request, deadline_ms)
        self._pending[approval_id] = pending
        try:
            # Durable before anyone is asked: a daemon that dies while the request waits
            # leaves it in the history, pending.
            await self._record_durably(pending)
            log.info("approval requested kind=%s", request.kind)
            for conn_id in self._targets(run):
                self._send(conn_id, pending.frame())
            self.observe(run.session_id, _requested(pending.frame()))
            decision, by = await asyncio.wait_for(asyncio.shield(pending.future), timeout)
        except TimeoutError:
            decision, by = TIMED_OUT, DEADLINE_BY
            self._settle(pending, decision, by)
        except asyncio.CancelledError:
            self._settle(pending, CANCELLED, CANCELLED_BY)
            raise
        return decision

    def answer(self, conn_id: int, approval_id: str, decision: str) -> dict[str, Any] | None:
        """Settle a request; None when this answer won (``approval_resolved`` went out to
        every attached connection), else the ``approval_already_resolved`` frame body.

        Raises:
            UnknownApproval: not a request this connection is attached to, or an answer
                its options do not offer.
        """
        pending = self._pending.get(approval_id)
        if pending is None:
            settled = self._settled.get(approval_id)
            if settled is None:
                raise UnknownApproval
            return {"decision": settled[0], "by": settled[1]}
        if conn_id not in self._targets(pending.run) or decision not in pending.request.options:
            raise UnknownApproval
        self._settle(pending, decision, self._listeners[conn_id].label)
        return None

    def _settle(self, pending: Pending, decision: str, by: str) -> None:
        if self._pending.pop(pending.approval_id, None) is None:
            return
        if not pending.future.done():
            pending.future.set_result((decision, by))
        self._settled[pending.approval_id] = (decision, by)
        while len(self._settled) > MAX_SETTLED:
            self._settled.popitem(last=False)
        self._record(pending, decision, by)
        log.info("approval settled decision=%s", decision)
        frame = v2.approval_resolved(pending.approval_id, decision, by)
        for conn_id in self._targets(pending.run):
            self._send(conn_id, frame)
        event = {"event": "approval_resolved", "session_id": pending.run.session_id}
        event |= {"turn_id": pending.run.turn_id} | {k: v for k, v in frame.items() if k != "t"}
        self.observe(pending.run.session_id, event)

    def turn_ended(self, turn_id: str) -> None:
        self._followers.pop(turn_id, None)

    async def _record_durably(self, pending: Pending) -> None:
        seq = self._record(pending, "pending", None)
        if seq is None:
            return
        try:
            await pending.run.attachment.lease.durable(seq)
        except ServiceError:
            log.warning("an approval could not be recorded")

    def _record(self, pending: Pending, decision: str, by: str | None) -> int | None:
        """The request in the session's history (queued for the group commit: the
        turn's next durable point covers it); its ``seq``, or None when it could not be
        queued. Best effort: a failed record fails the turn through its own records."""
        record = {
            "type": "approval",
            "turn_id": pending.run.turn_id,
            "approval_id": pending.approval_id,
            "kind": pending.request.kind,
            "decision": decision,
            "subject": _subject(pending.request.summary),
            "by": by,
        }
        try:
            return pending.run.attachment.lease.submit(record)
        except (ServiceError, ValueError):
            log.warning("an approval could not be recorded")
            return None

    # -- session policies --------------------------------------------------------------------

    def session_policy(self, session_id: str) -> Policy | None:
        return self._policies.get(session_id)

    def set_session_policy(self, session_id: str, policy: Policy | None) -> bool:
        """The session's own policy from its next tool call on (None: the settings');
        False when too many sessions have one already (nothing changed)."""
        if policy is None:
            self._policies.pop(session_id, None)
        elif session_id in self._policies or len(self._policies) < MAX_SESSION_POLICIES:
            self._policies[session_id] = policy
        else:
            return False
        log.info("session approval policy set")
        return True

    async def effective_policy(self, ctx: LaunchContext, session_id: str) -> Policy | None:
        """The policy the session's calls in ``ctx``'s project get now (its own choice
        within the project's floor, else the settings'); None if the settings cannot be
        read (a turn would fail on them too)."""
        try:
            settings = await asyncio.to_thread(load_settings, ctx)
        except ServiceError:
            return None
        return settings.approvals.policy_for(self.session_policy(session_id))

    # -- grants ------------------------------------------------------------------------------

    def session_rules(self, session_id: str) -> Rules:
        """The grants held for the session (read by :meth:`load_session`)."""
        return self._grants.get(session_id, Rules())

    def _hold(self, session_id: str, rules: Rules) -> Rules:
        if not rules:  # what ``session_rules`` gives anyway: most sessions hold nothing
            self._grants.pop(session_id, None)
            return rules
        self._grants[session_id] = rules
        self._grants.move_to_end(session_id)
        while len(self._grants) > MAX_HELD_GRANTS:
            self._grants.popitem(last=False)  # still stored: read again when needed
        return rules

    async def load_session(self, session_id: str) -> Rules:
        """The session's stored grants, held from now on (a turn's start reads them).
        Unreadable ones count as none (logged): the calls are asked again."""
        if self._store is None:
            return self.session_rules(session_id)
        try:
            return self._hold(session_id, await self._read(session_id))
        except ServiceError:
            log.warning("a session's grants could not be read")
            return self._hold(session_id, Rules())

    async def _read(self, session_id: str) -> Rules:
        """Raises ServiceError (``session_unavailable``): unreadable metadata."""
        assert self._store is not None
        try:
            document = await asyncio.to_thread(self._store.grants, session_id)
        except ServiceError as exc:
            if exc.code is ErrorCode.INVALID_SESSION_ID:
                return Rules()  # no such session: it has no grants
            raise
        return stored_rules(document)

    async def grant_session(self, session_id: str, kind: str, value: tuple[str, ...] | str) -> bool:
        """Store an "allow for this session" answer with the session; False when it
        could not be stored (too many grants, or the metadata cannot be written): then
        it was not granted, and the session's next such call is asked again."""
        if self._store is None:
            self._hold(session_id, self.session_rules(session_id).changed(kind, value, add=True))
            return True

        def add(stored: object) -> object:
            document = stored_rules(stored).changed(kind, value, add=True).as_document()
            if len(orjson.dumps(document)) > MAX_GRANTS_BYTES:
                raise _TooManyGrants
            return document

        try:
            document = await asyncio.to_thread(self._store.change_grants, session_id, add)
        except (ServiceError, _TooManyGrants):
            log.warning("a session grant could not be stored")
            return False
        self._hold(session_id, stored_rules(document))
        return True

    async def revoke_session(
        self, session_id: str, kind: str, value: tuple[str, ...] | str
    ) -> bool:
        """Remove one session grant; False when the session has no such grant.

        Raises:
            ServiceError: the session's metadata cannot be read or written.
        """
        if self._store is None:
            current = self.session_rules(session_id)
            if value not in getattr(current, kind):
                return False
            self._hold(session_id, current.changed(kind, value, add=False))
            return True
        if value not in getattr(await self._read(session_id), kind):
            return False
        document = await asyncio.to_thread(
            self._store.change_grants,
            session_id,
            lambda stored: stored_rules(stored).changed(kind, value, add=False).as_document(),
        )
        self._hold(session_id, stored_rules(document))
        return True

    async def grants(self, ctx: LaunchContext, session_id: str | None) -> dict[str, Any]:
        """``grants_result`` fields: the session's grants (with a session) and the
        project's allow rules, with whether the project's are honoured (trusted)."""
        project, honoured = await asyncio.to_thread(project_grants, ctx)
        session = None if session_id is None else await self._current(session_id)
        return {
            "session": None if session is None else session.as_document(),
            "project": project.as_document(),
            "project_honoured": honoured,
        }

    async def _current(self, session_id: str) -> Rules:
        """The session's grants as stored now. Raises ServiceError: unreadable."""
        if self._store is None:
            return self.session_rules(session_id)
        return await self._read(session_id)

    async def revoke_project(
        self, ctx: LaunchContext, kind: str, value: tuple[str, ...] | str
    ) -> bool:
        return await asyncio.to_thread(revoke_project_grant, ctx, kind, value)


class TurnApprover:
    """One turn's :class:`~magi_code.turns.approvals.Approver`."""

    def __init__(self, service: ApprovalService, run: TurnRun) -> None:
        self._service = service
        self._run = run

    @property
    def can_ask(self) -> bool:
        return self._run.conn.approvals

    def session_rules(self) -> Rules:
        return self._service.session_rules(self._run.session_id)

    def session_policy(self) -> Policy | None:
        return self._service.session_policy(self._run.session_id)

    async def grant_session(self, kind: str, value: tuple[str, ...] | str) -> None:
        await self._service.grant_session(self._run.session_id, kind, value)

    async def ask(self, request: ApprovalAsk, timeout: float) -> str:
        return await self._service.ask(self._run, request, timeout)

    def stop_turn(self) -> None:
        self._run.cancel()


def _requested(frame: dict[str, Any]) -> dict[str, Any]:
    """An ``approval_request`` frame as a watchers' ``approval_requested`` event."""
    return {"event": "approval_requested"} | {k: v for k, v in frame.items() if k != "t"}


def _subject(summary: Mapping[str, Any]) -> str:
    """The request's subject in one bounded line: the command, the path, or the tool."""
    if "command" in summary:
        text = str(summary["command"])
    elif "path" in summary:
        text = str(summary["path"])
    else:
        text = f"{summary.get('server')}/{summary.get('tool')}"
    return truncate_utf8(text, MAX_SUBJECT_BYTES)[0]
