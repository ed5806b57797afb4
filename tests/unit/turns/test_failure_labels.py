"""Every way a turn can fail maps to one fixed label with a remedy, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

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
        (TurnSetupError(failures.SANDBOX_UNAVAILABLE), "sandbox_unavailable"),
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


def test_a_credential_remedy_names_what_gives_the_turns_provider_credentials() -> None:
    custom = failures.remedy("provider_auth_failed", "local", "LOCAL_API_KEY")
    assert custom == "the provider refused the credentials: check the key in LOCAL_API_KEY"
    missing = failures.remedy("auth_missing", "local", "LOCAL_API_KEY")
    assert "set LOCAL_API_KEY" in missing and "login" not in missing
    assert "login --provider anthropic" in failures.remedy("provider_auth_failed", "anthropic")
    assert "login --provider openai-codex" in failures.remedy("auth_missing", "openai-codex")
    # A custom provider without a key variable was refused: it needs one.
    assert "`api_key_env`" in failures.remedy("provider_auth_failed", "local", None)
    # A "variable name" that looks like a key is never repeated.
    pasted = "sk_live_0123456789abcdef0123456789"
    assert pasted not in failures.remedy("provider_auth_failed", "local", pasted)
    # Other labels keep their fixed remedy whatever the provider.
    assert (
        failures.remedy("provider_unavailable", "local", "K")
        == failures.REMEDIES["provider_unavailable"]
    )


def test_every_remedy_is_one_bounded_line_and_names_no_protocol_operation() -> None:
    widest = "K" * 128  # api_key_env's bound in the settings schema
    texts = [failures.remedy(label) for label in failures.LABELS]
    for provider in ("anthropic", "openai-codex", "local"):
        for label in ("auth_missing", "provider_auth_failed"):
            texts += [failures.remedy(label, provider, widest), failures.remedy(label, provider)]
    for text in texts:
        assert "\n" not in text and len(text.encode()) <= failures.MAX_REMEDY_BYTES, text
        assert "config.set" not in text and "turn.start" not in text, text
    assert all(len(label) <= failures.MAX_LABEL_BYTES for label in failures.LABELS)


def test_docs_turns_md_lists_every_label_with_its_remedy() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "turns.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", text, re.M)
    table = [(label, remedy) for label, remedy in rows if label in failures.REMEDIES]
    assert table == list(failures.REMEDIES.items())
