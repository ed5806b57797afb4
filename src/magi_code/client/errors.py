"""What a client of the daemon can be told went wrong (see ``docs/client.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class DaemonUnavailable(Exception):
    """No daemon answers, or the connection to it was lost.

    Raised by ``connect`` (no daemon running, refused while draining, lost during the
    handshake) it is safe to retry: nothing was sent. Raised by ``snapshot``, ``attach``,
    ``take_control`` or ``control`` when the connection ends before their answer, a retry
    on a new connection is safe too (these operations may be repeated). A v1 request that
    was sent never fails with this class itself but with :class:`OutcomeUnknown`.
    """


class DaemonDraining(DaemonUnavailable):
    """The daemon refused the handshake because it is stopping (``draining``)."""


class OutcomeUnknown(DaemonUnavailable):
    """A v1 request was sent but its response never came: it may or may not have run.

    The connection ended (lost, closed, or broken by a fatal ``error`` frame or a protocol
    error, then ``code`` names it) after the request's bytes were written. ``turn.start``
    always carries an ``idempotency_key``: pass this exception to
    :meth:`magi_code.client.Client.resume_turn` on a new connection to learn what
    happened (the original acceptance or error) and follow the turn, without starting a
    second one. Other methods carry ``idempotency_key=None``; retry them only if repeating
    them is harmless.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str,
        payload: Mapping[str, Any] | None,
        session_id: str | None,
        request_id: str,
        idempotency_key: str | None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.method = method
        self.payload: dict[str, Any] = dict(payload or {})
        self.session_id = session_id
        self.request_id = request_id
        self.idempotency_key = idempotency_key
        self.code = code


class DaemonError(Exception):
    """A daemon answered but cannot serve us, or broke the protocol.

    ``code`` is the RFC-0002 code: of a refusal, of a fatal ``error`` frame
    (``framing_error``, ``unknown_frame``, ``protocol_error``, ``internal_error``; also
    used when *this* client finds the daemon's frames invalid), or of the answer to one
    request (``attach_error``, ``snapshot_error``, ``grant_error``, ``control_error``,
    ``request_error``, ``approval_error``, ``grants_error``, ``steer_error``,
    ``session_error``).
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class DaemonTimeout(DaemonError):
    """A daemon is there but did not accept or answer the handshake in time.

    It may be stopped (``SIGSTOP``), wedged or badly overloaded; nothing was sent beyond
    ``hello``, and nothing was killed or removed.
    """


class ForeignDaemon(DaemonError):
    """The socket is served by a process of another user; nothing was sent to it."""


class DeadlineExceeded(DaemonError):
    """The request's deadline passed before the daemon ran it (it did not run)."""


class ApprovalError(DaemonError):
    """An ``approval_answer`` was refused: ``unknown_approval`` (no such request this
    connection is attached to, or a decision it does not offer) or ``invalid_request``."""


class GrantsError(DaemonError):
    """``grants_list``/``grants_revoke`` was refused: ``invalid_request`` or
    ``grants_unavailable`` (the project settings cannot be read or written)."""


class SteerError(DaemonError):
    """A ``steer`` did not enter the turn: ``turn_finished`` (the turn ended first; the
    daemon wrote nothing of the text, which ``text`` holds for the caller to send again),
    ``unknown_turn`` (no turn of a session this connection controls) or
    ``invalid_request``."""

    text: str | None = None
    # ``turn_finished``: the queue entry the text became (RFC-0002 §6.12), at the head of
    # the session's queue; None when the queue could not take it (then ``text`` is yours).
    entry_id: str | None = None


class QueueError(DaemonError):
    """A prompt queue call was refused (RFC-0002 §6.12): ``not_controller`` (the
    connection does not control the session), ``unknown_entry``, ``limit_exceeded`` (the
    queue is full), ``turn_finished`` (``queue_send_now``: the turn ended before the text
    entered; the entry is at the head of the queue), ``invalid_request`` and the v1
    session codes."""


class SessionError(DaemonError):
    """A session library call was refused (RFC-0002 §6.11): ``invalid_request`` (bad
    arguments, a cursor the daemon did not issue, a title with nothing displayable),
    ``invalid_session_id``, ``session_unavailable`` or ``session_busy``."""


class ControlError(DaemonError):
    """``take_control``, ``request_control``, ``release_control`` or ``answer_control``
    was refused (``grant_error``: ``session_busy``, ``invalid_request``,
    ``limit_exceeded``, the v1 session codes, ...)."""


class ControlRefused(ControlError):
    """The session's controller refused a ``request_control`` (``control_refused``), or
    the request could not be granted."""


class WatchError(DaemonError):
    """``watch``/``unwatch`` was refused: ``resync_required`` (the cursor does not match
    the session's history: watch from the start or a ``session.replay`` cursor),
    ``limit_exceeded``, ``invalid_request`` or a v1 session code."""
