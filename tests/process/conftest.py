"""Run every test here in both service modes (embedded and through the daemon)."""

from tests.support.modes import service_mode

__all__ = ["service_mode"]
