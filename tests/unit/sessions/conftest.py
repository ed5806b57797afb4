"""Fixtures of the session store tests: each module provides its own ``store``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from magi_code.sessions.store import SessionStore, WriterLease


@pytest.fixture
def session(store: SessionStore) -> str:
    return store.create()


@pytest.fixture
def lease(store: SessionStore, session: str) -> Iterator[WriterLease]:
    held = store.acquire_writer_lease(session)
    yield held
    held.release()
