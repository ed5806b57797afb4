"""Durable sessions: append-only JSONL histories, writer leases, listing, replay and
turn outcomes.

See ``docs/sessions.md`` for the layout, record format and guarantees.
"""

from magi_code.sessions.ids import new_session_id, validate_session_id
from magi_code.sessions.outcomes import TurnOutcome
from magi_code.sessions.store import SessionContext, SessionStore, WriterLease

__all__ = [
    "SessionContext",
    "SessionStore",
    "TurnOutcome",
    "WriterLease",
    "new_session_id",
    "validate_session_id",
]
