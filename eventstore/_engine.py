"""SQLAlchemy engines configured for the event log on Postgres and SQLite."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from fleetledger.eventstore.errors import InvalidEvent

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_DATABASE_URL",
    "is_sqlite",
    "libpq_conninfo",
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


def libpq_conninfo(url: str | URL) -> str:
    """The libpq connection string for a Postgres URL, for connections made without SQLAlchemy.

    Built from the URL's parts rather than by re-rendering it: libpq does not read '+' in a
    URI's query as a space, so ``options=-c TimeZone=UTC`` would not survive the round trip.
    """
    parsed = normalise_url(url) if isinstance(url, str) else url
    parts: dict[str, Any] = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database,
    }
    for key, value in parsed.query.items():
        # SQLAlchemy gives a repeated key (several hosts, say) as a tuple; libpq takes a list.
        parts[key] = ",".join(value) if isinstance(value, tuple) else value
    return make_conninfo(**{k: v for k, v in parts.items() if v is not None})


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, **kwargs)
    engine = sa.create_engine(parsed, pool_pre_ping=True, **kwargs)

    @event.listens_for(engine, "connect")
    def _utc_session(dbapi_connection: Any, _record: Any) -> None:
        # Timestamps come back in UTC whatever the server's TimeZone, so recorded_at means the
        # same everywhere. psycopg then converts to datetime.timezone.utc, which costs a
        # fraction of the per-row ZoneInfo conversion a zone name such as 'Etc/UTC' gets.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        dbapi_connection.execute("SET TimeZone TO 'UTC'")
        dbapi_connection.autocommit = autocommit

    return engine


_WAL_SWITCH_ATTEMPTS = 20


def _switch_to_wal(dbapi_connection: Any) -> None:
    """Put the database in WAL mode (a no-op once it is; the mode is stored in the file).

    The switch itself needs the file to itself, and SQLite reports a busy file at once instead of
    waiting on the busy timeout: two processes opening a new database together (two ``db
    upgrade`` runs) can meet it. ``BEGIN IMMEDIATE`` does wait on the timeout, so waiting there
    for the other writer and trying again ends once that writer commits.
    """
    for attempt in range(_WAL_SWITCH_ATTEMPTS):
        try:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == _WAL_SWITCH_ATTEMPTS - 1:
                raise
        dbapi_connection.execute("BEGIN IMMEDIATE")
        dbapi_connection.execute("COMMIT")


def _sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    engine = sa.create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 30.0}, **kwargs
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's implicit transactions are deferred and start late; we issue BEGIN ourselves
        # (see _begin) so the write lock is taken at the start of a write transaction.
        dbapi_connection.isolation_level = None
        _switch_to_wal(dbapi_connection)
        cursor = dbapi_connection.cursor()
        # FULL: an acknowledged append survives power loss, not only a process crash.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine
