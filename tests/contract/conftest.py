"""The service-mode matrix: the product's mode, and both for tests marked ``both_modes``."""

from tests.support.modes import service_mode

__all__ = ["service_mode"]
