"""``turn.start`` / ``turn.cancel``: admission, the per-turn event order, terminals.

Theory of operation, per turn:

- admission (on the coordinator): payload, active-turn limit, session attachment (reuse,
  implicit, or a new session), bounded history read, for a persistent client the settings
  capture (``settings_gate``; then its deadline and its hold on the session are checked
  again), the user message made durable, the start request ID kept reserved; the
  acceptance response and ``turn.started`` (sequence 0) go out in one batch, and the
  worker starts only after that batch was written;
- the worker (``TurnRun``) runs the agent; a v1 client's worker first reloads the
  settings (its start is never refused for a settings write). Every assistant delta and
  every *attempted* activity takes the next value of one per-turn sequence counter
  *before* it is queued; deltas wait for queue space, activity never does (a full queue
  drops it and counts it);
- streamed text is persisted while it streams, in bounded increments (``turns.streamed``);
- the turn's records are queued for the session's group commit without waiting for their
  fsync (``WriterLease.enqueue``); every event is queued with the seq of the last record
  submitted before it, and the pump releases it only once that record is durable, so
  whatever the client saw is in the durable history. A record that fails to become
  durable fails the turn, and no event queued after it is released;
- at the end admission closes, the rest of the text and the terminal record are
  persisted, the queue is drained, and ``turn.terminal`` takes the next sequence value. Its write
  releases the start request ID; only then is the session attachment settled.

Steering (v2, RFC-0002 §6.10): the controller's text waits in the run until the agent's
next request boundary, where it becomes a ``steer`` user record and a ``turn.steered``
event (sequenced like any turn event, released once the record is durable) and joins the
conversation; once the agent ended, what still waits is answered ``turn_finished``.

Cancellation interrupts only the agent task: if the agent already finished, the turn
still ends ``completed`` (completion won the race). A cancelled agent gets a bounded grace
(:func:`cancel_grace`) to finish its cleanup; past it the terminal is written without it,
and the worker is abandoned (logged) and refused any further text or record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import orjson

from magi_code.auth.credentials import CredentialsError
from magi_code.config.effective import Effective
from magi_code.dataclass import dataclass, field
from magi_code.protocol.deadlines import deadline_passed
from magi_code.protocol.envelope import Request
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.protocol.limits import MAX_PAYLOAD_BYTES, MAX_STRING_BYTES
from magi_code.protocol.text import utf8_parts
from magi_code.providers.errors import ProviderFailure
from magi_code.turns import failures
from magi_code.turns.agent import CompactionRequired, IterationLimitExceeded, OutputLimitExceeded
from magi_code.turns.runtime import (
    Prepared,
    PreparedSettings,
    TurnRequest,
    TurnRuntime,
    TurnSetupError,
    prepare_settings,
    read_settings,
)

from .approvals import ApprovalService
from .coordinator import Connection
from .idempotency import RETAIN_SECONDS, StartKeys, acceptance, repeated
from .output import Batch, TurnEvent, TurnInfo
from .routes import Endpoint, Reply, RequestExpired
from .sessions import Attachment, SessionService
from .settings_gate import SettingsGate
from .tool_relay import ToolRelay

log = logging.getLogger(__name__)

# The v1 active-turn limit is per client (a v1 service is one client); a service with
# many clients (the daemon) also caps the sum, above what any one client can hold.
MAX_ACTIVE_TURNS: Final = 16
MAX_SERVICE_TURNS: Final = 64
TURN_QUEUE_CAPACITY: Final = 256
# Turn events released together, in one batch (one write).
PUMP_BATCH: Final = 32
# A turn's batches queued for output and not yet written before its pump waits (through
# the daemon, written means acknowledged by the shim: a round trip per batch).
PUMP_IN_FLIGHT: Final = 4
# A queued turn event: (name, payload, the seq of the last record submitted before it).
_Queued = tuple[str, dict[str, Any], int]
# Provider deltas are split so that one delta event always fits its record.
MAX_DELTA_BYTES: Final = 8192
# How long a cancelled turn's agent may take to stop (a shell tool's process group takes
# up to about 8 s to be killed and reaped) before the turn's terminal is written without
# it. ``MC_CANCEL_GRACE_SECONDS`` in the launch environment sets another.
CANCEL_GRACE_SECONDS: Final = 10.0
CANCEL_GRACE_ENV: Final = "MC_CANCEL_GRACE_SECONDS"
# The terminal payload without its text, with counters and failure at their widest,
# bounds the text.
_TERMINAL_OVERHEAD: Final = len(
    orjson.dumps(
        {
            "turn_id": "t" * 128,
            "session_id": "s" * 128,
            "status": "cancelled",
            "assistant_text": "",
            "sequence": 2**63,
            "activity_dropped": 2**63,
            "activity_replay_available": False,
            "replay_required": True,
            "failure": "f" * failures.MAX_LABEL_BYTES,
            "remedy": "r" * failures.MAX_REMEDY_BYTES,
        }
    )
)


def cancel_grace(env: Mapping[str, str]) -> float:
    """``MC_CANCEL_GRACE_SECONDS`` (a positive number of seconds), else the default."""
    try:
        value = float(env.get(CANCEL_GRACE_ENV, ""))
    except ValueError:
        return CANCEL_GRACE_SECONDS
    return value if 0 < value < math.inf else CANCEL_GRACE_SECONDS


def _hashed(turn_id: str) -> str:
    # What the log says of a turn: its ID is a correlation key of the client's.
    return hashlib.sha256(turn_id.encode()).hexdigest()[:12]


@dataclass(slots=True)
class TurnReport:
    """What the log's one line per turn end says: counts, labels and codes only."""

    started: float = field(default_factory=time.monotonic)
    input_tokens: int = 0
    output_tokens: int = 0
    http_status: int | None = None
    retries: int = 0

    def count(self, usage: Mapping[str, Any]) -> None:
        # The main agent's requests plus the subagents' aggregate: each token once.
        source = usage.get("source")
        top_level = source == "provider_request" and "parent_activity_id" not in usage
        if top_level or source == "subagent_aggregate":
            self.input_tokens += int(usage.get("effective_input", 0))
            self.output_tokens += int(usage.get("output", 0))

    def log(self, run: TurnRun, status: str) -> None:
        effective = run.effective
        fields = {
            "turn": _hashed(run.turn_id),
            "provider": effective.provider_id if effective else None,
            "model": effective.model_id if effective else None,
            "status": status,
            "failure": run.failure,
            "http_status": self.http_status,
            "retries": self.retries,
            "duration_ms": round((time.monotonic() - self.started) * 1000),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        text = " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
        # INFO: in the daemon's log by default; the stdio service's stderr has the
        # failure line with its remedy instead (adapters print it).
        log.info("turn end %s", text, extra={"fields": fields})


def failure_label(exc: BaseException) -> str:
    """The fixed label (``turns/failures.py``) for what ended a turn; never exception text."""
    label: str
    if isinstance(exc, ProviderFailure):
        label = exc.label.value
    elif isinstance(exc, ServiceError):
        label = exc.code.value
    elif isinstance(exc, CredentialsError | TurnSetupError):
        label = exc.label
    elif isinstance(exc, OutputLimitExceeded):
        label = failures.OUTPUT_LIMIT
    elif isinstance(exc, IterationLimitExceeded):
        label = failures.REQUEST_LIMIT
    elif isinstance(exc, OSError):
        label = failures.STORAGE
    else:
        label = failures.INTERNAL
    return label if label in failures.REMEDIES else failures.INTERNAL


class TurnRun:
    """One accepted turn: its sequence counter, bounded event queue, and worker."""

    def __init__(
        self,
        service: TurnService,
        conn: Connection,
        info: TurnInfo,
        attachment: Attachment,
        turn: TurnRequest,
        prepared: Prepared | None,
    ) -> None:
        self.service = service
        self.conn = conn
        self.info = info
        self.request_id = info.request_id
        self.attachment = attachment
        self.session_id = attachment.session_id
        self.turn_id = info.turn_id
        self.turn = turn
        # Captured at admission (persistent client), else reloaded by the worker.
        self.prepared = prepared
        self.next_sequence = 1
        self.activity_dropped = 0
        self.text_parts: list[str] = []
        self._text_bytes = 0
        self._text_encoded = 0
        # (event, payload, seq of the last record submitted before it)
        self._queue: asyncio.Queue[_Queued | None] = asyncio.Queue(TURN_QUEUE_CAPACITY)
        self._admission_open = True
        self.agent_task: asyncio.Task[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self._settle_text: Callable[[], Awaitable[None]] | None = None
        self._cancel_requested = False
        # Done when the agent ended, or when its cancellation grace ran out first.
        self._joined: asyncio.Future[None] | None = None
        self._grace: asyncio.TimerHandle | None = None
        self._grace_seconds = CANCEL_GRACE_SECONDS
        self._over = False  # the terminal record is written: the agent may write no more
        self.failure: str | None = None  # the label, once the turn failed
        self.remedy: str | None = None
        self.report = TurnReport()
        # Steer texts waiting for the next request boundary, each with its answer: true
        # once it entered the turn, false when the agent ended first.
        self._steers: list[tuple[str, asyncio.Future[bool]]] = []
        self._steering = True  # the agent may still reach a request boundary

    @property
    def effective(self) -> Effective | None:
        """The settings the turn runs with (None until read, or when they could not be)."""
        prepared = self.prepared
        return prepared.effective if isinstance(prepared, PreparedSettings) else None

    # -- the sink the agent writes to ----------------------------------------------------

    async def text(self, delta: str) -> None:
        if not self._admission_open:
            raise asyncio.CancelledError  # an abandoned agent: the terminal has the text
        for piece in utf8_parts(delta, MAX_DELTA_BYTES):
            encoded = len(orjson.dumps(piece)) - 2
            size = len(piece.encode())
            if (
                self._text_bytes + size > MAX_STRING_BYTES
                or _TERMINAL_OVERHEAD + self._text_encoded + encoded > MAX_PAYLOAD_BYTES
            ):
                raise OutputLimitExceeded
            self._text_bytes += size
            self._text_encoded += encoded
            self.text_parts.append(piece)
            sequence = self._stamp()
            payload = {"turn_id": self.turn_id, "sequence": sequence, "text": piece}
            mark = self.attachment.lease.submitted_seq
            await self._queue.put(("turn.assistant_delta", payload, mark))

    def activity(self, payload: dict[str, Any]) -> None:
        if not self._admission_open:
            return
        if payload.get("kind") == "usage":
            self.report.count(payload)
        sequence = self._stamp()
        event = {"turn_id": self.turn_id, "sequence": sequence, "activity": payload}
        try:
            self._queue.put_nowait(("turn.activity", event, self.attachment.lease.submitted_seq))
        except asyncio.QueueFull:
            self.activity_dropped += 1

    async def record(self, record: Mapping[str, Any]) -> int:
        if self._over:
            raise asyncio.CancelledError  # an abandoned agent: nothing after the terminal
        # Queued for the group commit; the events queued after it wait for it (``_pump``).
        return await self.attachment.lease.enqueue(record)

    def steer(self, text: str) -> asyncio.Future[bool]:
        """Hand ``text`` to the agent's next request boundary; the future says whether it
        entered the turn (false: the agent ended first)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._steering and not self._cancel_requested:
            self._steers.append((text, future))
        else:
            future.set_result(False)
        return future

    async def take_steers(self) -> list[str]:
        """The waiting steer texts, each made a durable user record where it enters and
        announced as ``turn.steered`` (the agent's ``steers``)."""
        taken, self._steers = self._steers, []
        landed = False
        try:
            for text, _ in taken:
                user = {"type": "user", "turn_id": self.turn_id, "text": text, "steer": True}
                mark = await self.record(user)
                payload = {"turn_id": self.turn_id, "sequence": self._stamp(), "text": text}
                await self._queue.put(("turn.steered", payload, mark))
            if taken:
                await self.attachment.lease.durable(self.attachment.lease.submitted_seq)
            landed = True
        finally:
            for _, future in taken:
                if not future.done():
                    future.set_result(landed)
        return [text for text, _ in taken]

    def _close_steering(self) -> None:
        # No request boundary comes any more: what waits is answered ``turn_finished``.
        self._steering = False
        waiting, self._steers = self._steers, []
        for _, future in waiting:
            if not future.done():
                future.set_result(False)

    def _stamp(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        return sequence

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self.task is not None:
            return  # started by its acceptance write or by connection cleanup, once
        self.agent_task = asyncio.create_task(self._agent())
        self._joined = asyncio.get_running_loop().create_future()
        self.agent_task.add_done_callback(self._agent_ended)
        if self._cancel_requested:
            self._cancel_agent()
        self.task = asyncio.create_task(self._run())

    async def _agent(self) -> None:
        if self.prepared is None:
            # A v1 turn: the settings as they are now, right before provider execution.
            self.prepared = await asyncio.to_thread(
                read_settings, self.turn.ctx, self.turn.selection
            )
        # The session's stored grants, as they are when the turn starts.
        await self.service.approvals.load_session(self.session_id)
        await self.service.runtime.run(
            self.turn,
            self.prepared,
            self,
            self._keep_settle,
            self.service.approvals.approver(self),
            self.service.relay.frontend(self),
            self.take_steers if self.conn.persistent else None,
        )

    def _keep_settle(self, settle: Callable[[], Awaitable[None]]) -> None:
        # The runtime hands back how to make the text streamed so far durable.
        self._settle_text = settle

    def cancel(self) -> None:
        # Before the worker starts (acceptance not yet written) the request is remembered.
        self._cancel_requested = True
        if self.agent_task is not None:
            self._cancel_agent()

    def _cancel_agent(self) -> None:
        assert self.agent_task is not None and self._joined is not None
        self.agent_task.cancel()
        if self._grace is None and not self._joined.done():
            self._grace_seconds = cancel_grace(self.turn.ctx.env)
            loop = asyncio.get_running_loop()
            self._grace = loop.call_later(self._grace_seconds, self._grace_over)

    def _grace_over(self) -> None:
        if self._joined is not None and not self._joined.done():
            self._joined.set_result(None)

    def _agent_ended(self, task: asyncio.Task[None]) -> None:
        self._close_steering()
        if not task.cancelled():
            task.exception()  # retrieved here too: an abandoned agent's is never read
        if self._grace is not None:
            self._grace.cancel()
        if self._joined is not None and not self._joined.done():
            self._joined.set_result(None)

    def event(self, name: str, payload: dict[str, Any]) -> TurnEvent:
        envelope = self.conn.event(self.request_id, self.session_id, name, payload)
        return TurnEvent(self.info, name, payload["sequence"], envelope)

    async def _pump(self) -> None:
        """Release the queued events in order, each once the records before it are
        durable. The events queued behind it whose records are durable already go in the
        same batch (one write), at most ``PUMP_BATCH``; at most ``PUMP_IN_FLIGHT`` batches
        are queued for output and not yet written, and the pump returns once all are. Once
        a record failed (the turn fails), activity is dropped and counted, and text is
        released without waiting."""
        lease = self.attachment.lease
        held = False  # a record an event depends on failed: no more activity
        in_flight: deque[Batch] = deque()
        item = await self._queue.get()
        while item is not None:
            events: list[TurnEvent] = []
            carried: _Queued | None = None  # taken from the queue; leads the next batch
            ended = False
            while True:
                name, payload, mark = item
                if events and not held and mark > lease.durable_seq:
                    carried = item
                    break
                if not held and mark > lease.durable_seq:
                    try:
                        await lease.durable(mark)
                    except ServiceError:
                        held = True
                if held and name == "turn.activity":
                    self.activity_dropped += 1  # the terminal accounts for it
                else:
                    # Text goes out even after a failed record: the terminal's
                    # assistant_text, sent regardless, holds it anyway.
                    events.append(self.event(name, payload))
                if len(events) >= PUMP_BATCH or self._queue.empty():
                    break
                next_item = self._queue.get_nowait()
                if next_item is None:
                    ended = True
                    break
                item = next_item
            if events:
                if len(in_flight) >= PUMP_IN_FLIGHT:
                    await in_flight.popleft().done.wait()
                batch = Batch([e.envelope for e in events], turn_events=tuple(events))
                in_flight.append(self.conn.output.put(batch))
            if ended:
                break
            item = carried if carried is not None else await self._queue.get()
        for batch in in_flight:
            await batch.done.wait()

    async def _run(self) -> None:
        agent, joined = self.agent_task, self._joined
        assert agent is not None and joined is not None
        pump = asyncio.create_task(self._pump())
        status = "completed"
        recorded = None  # the session's terminal status when it differs from the event's
        try:
            await asyncio.shield(joined)
            if not agent.done() or agent.cancelled():
                status = "cancelled"  # turn.cancel cancelled the agent
            else:
                agent.result()  # raises what failed the agent
                # Completed only once everything it recorded is durable.
                await self.attachment.lease.durable(self.attachment.lease.submitted_seq)
        except asyncio.CancelledError:
            # Owner drop cancelled this task: the agent gets its grace, as on turn.cancel.
            self.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(joined)
            status = "cancelled"
        except Exception as exc:  # noqa: BLE001 - the turn's failure boundary
            status = "failed"
            self._failed(exc)
            if isinstance(exc, CompactionRequired):
                recorded = "compaction_required"
        if not agent.done():
            self.service.abandon(agent)
            log.warning(
                "turn %s: its worker did not stop within %g s of the cancellation; "
                "the turn ends without it",
                _hashed(self.turn_id),
                self._grace_seconds,
            )
        # The agent's task keeps how it ended, whose traceback keeps the frames it went
        # through (this one too, when it was raised here), and they keep this run: held
        # from here, that cycle would keep the whole turn until the cycle collector ran.
        self.agent_task = None
        del agent
        self._close_steering()  # also for an agent abandoned past its grace
        self.report.log(self, status)
        self._admission_open = False
        # Nothing stamps a sequence after admission closed: the terminal's is known now.
        sequence = self._stamp()
        await self._persist_end(recorded or status, sequence)
        self._over = True
        await self._queue.put(None)
        await pump
        terminal = {
            "turn_id": self.turn_id,
            "session_id": self.session_id,
            "status": status,
            "assistant_text": "".join(self.text_parts),
            "sequence": sequence,
            "activity_dropped": self.activity_dropped,
            "activity_replay_available": False,
            "replay_required": True,
        }
        if self.failure is not None:
            terminal["failure"], terminal["remedy"] = self.failure, self.remedy
        event = self.event("turn.terminal", terminal)
        batch = Batch(
            [event.envelope],
            after_write=[lambda: self.conn.release(self.request_id)],
            turn_events=(event,),
        )
        # The session is free once the terminal is written: a client may start its next
        # turn on it as soon as it reads the terminal, before this task resumes.
        batch.after_write.append(self._settled)
        await self.conn.output.put(batch).done.wait()
        await self.service.finished(self)

    def _failed(self, exc: Exception) -> None:
        self.failure = failure_label(exc)
        effective = self.effective
        provider = None if effective is None else effective.provider
        if provider is None:
            self.remedy = failures.remedy(self.failure)
        else:
            self.remedy = failures.remedy(self.failure, provider.provider_id, provider.api_key_env)
        if isinstance(exc, ProviderFailure):
            self.report.http_status, self.report.retries = exc.status, exc.retries

    def _settled(self) -> None:
        self.service.active.pop(self.turn_id, None)
        self.service.approvals.turn_ended(self.turn_id)
        self.attachment.cancel_turn = None
        self.attachment.idle.set()

    async def _persist_end(self, status: str, sequence: int) -> None:
        terminal = {
            "type": "terminal",
            "turn_id": self.turn_id,
            "status": status,
            "assistant_text": "".join(self.text_parts),
            "sequence": sequence,
            "failure": self.failure,
            "remedy": self.remedy,
        }
        try:
            # Increments already written stay; the append in flight and the rest follow,
            # in order, before the terminal.
            # Dropped once used: it is the agent's, and the agent holds this run (its sink).
            settle, self._settle_text = self._settle_text, None
            if settle is not None:
                await settle()
            await self.attachment.lease.append_async(terminal)
        except (OSError, ServiceError, ValueError):
            log.warning("could not persist the end of a turn")


class TurnService:
    def __init__(self, sessions: SessionService, runtime: TurnRuntime, gate: SettingsGate) -> None:
        self.sessions = sessions
        self.runtime = runtime
        self.gate = gate
        self.active: dict[str, TurnRun] = {}
        self.keys = StartKeys()
        # Agents that outlived their cancellation grace, held until they end.
        self._abandoned: set[asyncio.Task[None]] = set()
        # Approval requests of running turns, and session grants (core.approvals).
        self.approvals = ApprovalService(sessions.store)
        # Tool details and editor file requests to the turns' clients (core.tool_relay).
        self.relay = ToolRelay()
        # Told the session of each turn that finished (its attachment settled): the
        # session's prompt queue may run its next entry (core.queue).
        self.ended: Callable[[str], None] | None = None

    def routes(self) -> Mapping[str, Endpoint]:
        return {
            "turn.start": Endpoint(self._start),
            "turn.cancel": Endpoint(self._cancel),
        }

    async def _start(self, conn: Connection, request: Request, payload: dict[str, Any]) -> Reply:
        prompt = payload["prompt"]
        key = request.idempotency_key
        if key is None:
            return await self._admit(conn, request, prompt)
        slot = (request.session_id, key)
        outcome = await self.keys.repeat(slot)
        if outcome is None and request.session_id is not None:
            outcome = await self._durable_acceptance(request.session_id, key)
            outcome = outcome or await self.keys.repeat(slot)  # one may have begun meanwhile
        if outcome is not None:
            log.info("turn.start repeated an idempotency key")
            payload = repeated(outcome)
            return Reply(payload, session_id=payload["session_id"])
        future = self.keys.begin(slot)
        try:
            reply = await self._admit(conn, request, prompt)
        except ServiceError as exc:
            self.keys.settle(slot, future, exc.code)
            raise
        except BaseException:
            self.keys.abandon(slot, future)
            raise
        self.keys.settle(slot, future, dict(reply.payload))
        return reply

    async def _durable_acceptance(self, session_id: str, key: str) -> dict[str, Any] | None:
        """A start under ``key`` that an earlier service accepted on this session."""
        try:
            found = await asyncio.to_thread(self.sessions.store.find_turn_by_key, session_id, key)
        except ServiceError:
            return None  # admission reports the session's problem itself
        if found is None or found.accepted_at is None:
            return None
        if time.time() - found.accepted_at > RETAIN_SECONDS:
            return None
        return acceptance(found.turn_id, session_id)

    async def _admit(self, conn: Connection, request: Request, prompt: str) -> Reply:
        own = sum(1 for run in self.active.values() if run.conn is conn)
        if own >= MAX_ACTIVE_TURNS or len(self.active) >= MAX_SERVICE_TURNS:
            raise ServiceError(ErrorCode.TOO_MANY_ACTIVE_TURNS)
        if request.session_id is None:
            attachment = await self.sessions.create(conn, explicit=False)
        else:
            attachment = await self.sessions.attach(conn, request.session_id, explicit=False)
        if attachment.busy:
            # Another turn owns this attachment: refuse without touching its state.
            raise ServiceError(ErrorCode.SESSION_BUSY)
        try:
            # Claimed before any await; a close during admission is remembered.
            closed_early = asyncio.Event()
            attachment.cancel_turn = closed_early.set
            attachment.idle.clear()
            history = await asyncio.to_thread(
                self.sessions.store.load_context, attachment.session_id
            )
            prepared: Prepared | None = None
            if conn.persistent:
                with self.gate.capture():
                    prepared = await asyncio.to_thread(
                        prepare_settings, conn.ctx, self.sessions.selection(attachment.session_id)
                    )
                if deadline_passed(request.deadline_ms):
                    raise RequestExpired
            # Revalidate on the coordinator after the awaits: the client's output may be
            # gone, a close may have started, or (its client lost) another client may
            # have taken control of the session meanwhile.
            if conn.output.closed or not self.sessions.holds(conn, attachment):
                raise ServiceError(ErrorCode.SESSION_BUSY)
            turn_id = f"turn_{secrets.token_hex(12)}"
            user = {"type": "user", "turn_id": turn_id, "text": prompt}
            if request.idempotency_key is not None:
                user["idempotency_key"] = request.idempotency_key
            await attachment.lease.append_async(user)
        except BaseException:
            await self._abandon(attachment)
            raise
        turn = TurnRequest(
            conn.ctx,
            attachment.session_id,
            turn_id,
            prompt,
            history,
            self.sessions.mcp_servers(attachment.session_id),
            self.sessions.selection(attachment.session_id),
        )
        info = TurnInfo(
            turn_id,
            attachment.session_id,
            request.request_id,
            conn.conn_id,
            str(conn.ctx.project_dir),
            request.idempotency_key,
            prompt,
            conn.label,
        )
        run = TurnRun(self, conn, info, attachment, turn, prepared)
        attachment.cancel_turn = run.cancel
        if closed_early.is_set():
            run.cancel()
        self.active[turn_id] = run
        started = run.event(
            "turn.started",
            {
                "turn_id": turn_id,
                "session_id": attachment.session_id,
                "status": "started",
                "sequence": 0,
            },
        )
        return Reply(
            acceptance(turn_id, attachment.session_id),
            session_id=attachment.session_id,
            events=(started,),
            keep_reserved=True,
            after_write=run.start,
        )

    async def _abandon(self, attachment: Attachment) -> None:
        if attachment.cancel_turn is not None and attachment.idle.is_set() is False:
            attachment.cancel_turn = None
            attachment.idle.set()
        if not attachment.explicit:
            await self.sessions.release(attachment)

    async def _cancel(self, conn: Connection, request: Request, payload: dict[str, Any]) -> Reply:
        turn_id = payload["turn_id"]
        run = self.active.get(turn_id)
        # Cancel authority follows the session's controller (the starting client, or the
        # holder of a control grant, RFC-0002 §6).
        if run is None or run.attachment.owner != conn.conn_id:
            raise ServiceError(ErrorCode.UNKNOWN_TURN)
        run.cancel()
        return Reply({"turn_id": turn_id, "status": "cancellation_requested"})

    def steer(self, conn: Connection, turn_id: str, text: str) -> asyncio.Future[bool]:
        """``turn.steer``: only the session's controller steers (as ``turn.cancel``), and
        only a persistent client's turn (a v1 client's turn is never steered: its stream
        has no ``turn.steered``). Raises ``unknown_turn`` for any other turn."""
        run = self.active.get(turn_id)
        if run is None or run.attachment.owner != conn.conn_id or not run.conn.persistent:
            raise ServiceError(ErrorCode.UNKNOWN_TURN)
        return run.steer(text)

    def abandon(self, agent: asyncio.Task[None]) -> None:
        self._abandoned.add(agent)
        agent.add_done_callback(self._abandoned.discard)

    async def finished(self, run: TurnRun) -> None:
        self.active.pop(run.turn_id, None)
        await self.sessions.turn_finished(run.attachment)
        if self.ended is not None:
            self.ended(run.session_id)

    async def connection_detached(self, connection: Connection) -> None:
        """A persistent client went away: its accepted turns run on to their terminal."""
        for run in [run for run in self.active.values() if run.conn is connection]:
            if run.task is None:
                # Its acceptance was never delivered: the client never saw it, cancel it.
                run.start()
                run.cancel()
            assert run.task is not None
            with contextlib.suppress(asyncio.CancelledError):
                await run.task

    async def connection_closed(self, connection: Connection) -> None:
        runs = [run for run in self.active.values() if run.conn is connection]
        for run in runs:
            run.cancel()
        for run in runs:
            if run.task is None:
                # Accepted but its batch was never written (output closed): settle it.
                run.start()
            assert run.task is not None
            with contextlib.suppress(asyncio.CancelledError):
                await run.task
