"""pytest plugin: throwaway, migrated event stores for integration tests (yours and ours).

Registered as the ``fleetledger_eventstore`` pytest11 entry point, so installing fleetledger
makes these fixtures available:

- ``eventstore_postgres_server`` (session): a Postgres server URL. Taken from
  ``FLEETLEDGER_TEST_DATABASE_URL``; else a testcontainers Postgres when a Docker daemon answers;
  else the local server at 127.0.0.1:5432 (user ``postgres``). When none is reachable the
  Postgres tests are skipped with the reason — unless ``CI=true``, where that is a failure.
- ``postgres_url`` / ``sqlite_url``: a fresh database, migrated to head, dropped afterwards.
- ``postgres_store`` / ``sqlite_store``: an open :class:`~fleetledger.eventstore.EventStore` on it.

Each test gets its own database, cloned from a migrated template made once per run, so tests
cannot see each other's events and cloning costs milliseconds instead of a migration.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from fleetledger.eventstore import EventStore, migrate, open_store
from fleetledger.eventstore.scratch import scratch_postgres_database

__all__ = [
    "eventstore_postgres_server",
    "eventstore_postgres_template",
    "postgres_store",
    "postgres_url",
    "sqlite_store",
    "sqlite_url",
]

TEST_URL_ENV = "FLEETLEDGER_TEST_DATABASE_URL"
LOCAL_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def _reachable(url: str) -> str | None:
    engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return None
    except Exception as e:
        return str(e).strip().splitlines()[0]
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def eventstore_postgres_server() -> Iterator[str]:
    """URL of a Postgres server on which test databases may be created and dropped."""
    explicit = os.environ.get(TEST_URL_ENV)
    container = None
    if explicit:
        url = explicit
    elif _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16-alpine", driver="psycopg")
        container.start()
        url = container.get_connection_url()
    else:
        url = LOCAL_SERVER
    url = make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    problem = _reachable(url)
    if problem is not None:
        message = (
            f"no Postgres reachable at {make_url(url).render_as_string(hide_password=True)} "
            f"({problem}); set {TEST_URL_ENV}, start a Docker daemon, or start the local server"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield url
    finally:
        if container is not None:
            container.stop()


@pytest.fixture(scope="session")
def eventstore_postgres_template(eventstore_postgres_server: str) -> Iterator[str]:
    """Name of a database migrated to head once per run, for cheap copies (``TEMPLATE``)."""
    with scratch_postgres_database(
        eventstore_postgres_server, prefix="fleetledger_tmpl"
    ) as template_url:
        migrate.upgrade(template_url)
        name = make_url(template_url).database
        assert name is not None
        yield name


@pytest.fixture
def postgres_url(
    eventstore_postgres_server: str, eventstore_postgres_template: str
) -> Iterator[str]:
    """A fresh Postgres database at the schema's head, dropped after the test."""
    with scratch_postgres_database(
        eventstore_postgres_server, template=eventstore_postgres_template, prefix="fleetledger_test"
    ) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file at the schema's head."""
    url = f"sqlite:///{tmp_path / 'fleetledger.db'}"
    migrate.upgrade(url)
    return url


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[EventStore]:
    with contextlib.closing(open_store(postgres_url)) as store:
        yield store


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[EventStore]:
    with contextlib.closing(open_store(sqlite_url)) as store:
        yield store
