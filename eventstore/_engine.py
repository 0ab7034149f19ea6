"""SQLAlchemy engines configured for the event log on Postgres and SQLite."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from eventstore.errors import InvalidEvent

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_DATABASE_URL",
    "is_sqlite",
    "make_engine",
    "normalise_url",
    "resolve_url",
]

DEFAULT_DATABASE_URL = "sqlite:///fleetledger.db"
DATABASE_URL_ENV = "FLEETLEDGER_DATABASE_URL"
SQLITE_IMMEDIATE = {"sqlite_begin": "IMMEDIATE"}
"""Execution options for a SQLite write transaction: take the write lock at BEGIN, so two
writers queue on the busy timeout instead of failing with "database is locked" mid-transaction."""


def resolve_url(url: str | None) -> str:
    """An explicit URL, else ``FLEETLEDGER_DATABASE_URL``, else the embedded SQLite default."""
    return url or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL


def normalise_url(url: str) -> URL:
    """Accept the spellings people paste (``postgres://``, ``postgresql://``) and pin the driver."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as e:
        raise InvalidEvent(
            f"cannot parse database URL {url!r}: use 'postgresql+psycopg://user@host/db' "
            "or 'sqlite:///path/to/file.db'"
        ) from e
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise InvalidEvent(
                "an in-memory SQLite database cannot be shared between the store's threads; "
                "give a file path such as 'sqlite:///fleetledger.db'"
            )
        return parsed.set(drivername="sqlite")
    raise InvalidEvent(f"unsupported database {backend!r}: use Postgres or SQLite")


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, **kwargs)
    return sa.create_engine(parsed, pool_pre_ping=True, **kwargs)


def _sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    engine = sa.create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 30.0}, **kwargs
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's implicit transactions are deferred and start late; we issue BEGIN ourselves
        # (see _begin) so the write lock is taken at the start of a write transaction.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: an acknowledged append survives power loss, not only a process crash.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine
