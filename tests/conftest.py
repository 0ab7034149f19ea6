"""Shared fixtures. The store fixtures come from the ``eventstore.testing`` plugin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from fleetledger.eventstore import EventStore

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    """Commands under test configure structlog onto the (captured) stderr; put it back."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Parametrises a test over every storage backend."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database URL of the current backend."""
    return str(request.getfixturevalue(f"{backend}_url"))


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest) -> Iterator[EventStore]:
    """An open store on a fresh database of the current backend."""
    yield request.getfixturevalue(f"{backend}_store")
