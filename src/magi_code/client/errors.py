"""What a client of the daemon can be told went wrong."""

from __future__ import annotations


class DaemonUnavailable(Exception):
    """No daemon answers (not running, refused, draining); safe to start one and retry."""


class DaemonError(Exception):
    """A daemon answered but cannot serve us (foreign UID, incompatible, protocol error).

    ``code`` is the RFC-0002 code when the daemon answered one request with an error
    (``attach_error``, ``grant_error``, ``control_error``, ``request_error``).
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class DeadlineExceeded(DaemonError):
    """The request's deadline passed before the daemon ran it (it did not run)."""
