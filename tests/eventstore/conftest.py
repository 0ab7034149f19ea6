"""Fixtures for tests that need many fresh databases or one shared by several tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from fleetledger.eventstore import migrate
from tests.eventstore.support import FreshDatabase, postgres_database


@pytest.fixture(scope="session")
def fresh_postgres(
    eventstore_postgres_server: str, eventstore_postgres_template: str
) -> FreshDatabase:
    """Fresh migrated Postgres databases on demand, cloned from the plugin's template."""
    return lambda: postgres_database(
        eventstore_postgres_server, template=eventstore_postgres_template
    )


@pytest.fixture(scope="session")
def fresh_sqlite(tmp_path_factory: pytest.TempPathFactory) -> FreshDatabase:
    """Fresh migrated SQLite files on demand (migrating a new file takes milliseconds)."""

    @contextlib.contextmanager
    def make() -> Iterator[str]:
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'fleetledger.db'}"
        migrate.upgrade(url)
        yield url

    return make
