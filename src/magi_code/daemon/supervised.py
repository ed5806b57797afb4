""":class:`DaemonServer` as ``daemon run`` runs it: telling a service manager it stops.

Every stop decision goes through ``request_stop`` (a signal, ``daemon stop``, idle, a
replaced lock, an upgrade or restart), so this one override is where ``STOPPING=1`` is
sent, in the same step as the decision, before the owner drop drains anything. The
server itself knows nothing of service managers.
"""

from __future__ import annotations

from typing import Any

from .notify import Notifier
from .server import DaemonServer


class SupervisedServer(DaemonServer):
    """Set ``notifier`` and ``log_target`` after construction (defaults: neither)."""

    notifier: Notifier = Notifier(None)
    # "journal" when the daemon logs to systemd's journal; None means its ``daemon.log``.
    log_target: str | None = None
    _stopping_sent: bool = False

    def request_stop(self, reason: str) -> None:
        if not self._stopping_sent:
            self._stopping_sent = True
            self.notifier.stopping(f"stopping ({reason})")
        super().request_stop(reason)

    def status(self) -> dict[str, Any]:
        status = super().status()
        if self.log_target is not None:
            status["log"] = self.log_target
        return status
