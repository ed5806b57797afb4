"""Every way a turn can fail maps to one fixed label with a remedy, and nothing else."""

from __future__ import annotations

import pytest

from magi_code.auth import credentials
from magi_code.auth.credentials import CredentialsError
from magi_code.core.turns import failure_label
from magi_code.protocol.errors import ErrorCode, ServiceError
from magi_code.providers.errors import FailureLabel, ProviderFailure
from magi_code.turns import failures
from magi_code.turns.agent import IterationLimitExceeded, OutputLimitExceeded
from magi_code.turns.runtime import TurnSetupError


def test_every_provider_and_auth_label_has_a_remedy() -> None:
    produced = {label.value for label in FailureLabel} | {
        credentials.AUTH_MISSING,
        credentials.AUTH_REFRESH_FAILED,
        credentials.AUTH_UNREADABLE,
    }
    assert produced <= failures.REMEDIES.keys()
    assert all(remedy and "\n" not in remedy for remedy in failures.REMEDIES.values())


@pytest.mark.parametrize(
    ("exc", "label"),
    [
        (ProviderFailure(FailureLabel.RATE_LIMITED, status=429), "provider_rate_limited"),
        (CredentialsError(credentials.AUTH_MISSING), "auth_missing"),
        (TurnSetupError(failures.PROVIDER_NOT_CONFIGURED), "provider_not_configured"),
        (ServiceError(ErrorCode.CONFIGURATION_UNAVAILABLE), "configuration_unavailable"),
        (OutputLimitExceeded(), "output_limit_exceeded"),
        (IterationLimitExceeded(), "request_limit_exceeded"),
        (OSError(28, "No space left on device"), "storage_error"),
        (RuntimeError("https://secret.example/?key=sk-123"), "internal_error"),
        (ServiceError(ErrorCode.INVALID_PAYLOAD), "internal_error"),  # not a turn failure
        (CredentialsError("made up"), "internal_error"),
    ],
)
def test_an_exception_maps_to_its_fixed_label(exc: BaseException, label: str) -> None:
    assert failure_label(exc) == label


def test_describe_is_one_line_with_label_and_remedy() -> None:
    line = failures.describe("t-1", "auth_missing")
    assert line.startswith("turn t-1 failed: auth_missing — ")
    assert "magi-code login" in line and "\n" not in line
    assert failures.describe("t-2", "nonsense").endswith(failures.REMEDIES["internal_error"])
