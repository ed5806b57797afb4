from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.fake_oauth import FakeOAuthIssuer

from magi_code.auth.store import AuthStore


@pytest.fixture
def issuer() -> Iterator[FakeOAuthIssuer]:
    with FakeOAuthIssuer() as fake:
        yield fake


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "mc-home"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def store(home: Path) -> AuthStore:
    return AuthStore(home / "auth.json")
