"""SQLAlchemy engines configured for the event log on Postgres and SQLite.

**Timeouts.** Without them a database that stops answering — a host gone from the network, a
server stuck behind a lock — hangs its caller for ever: a TCP connection to a vanished host waits
for the kernel's retransmissions (minutes), and a statement waiting on a lock waits as long as
the lock is held. Every Postgres session the store opens, through the engine or directly with
libpq (the appender, the reader, the listener), is therefore opened with a ``connect_timeout``
(:data:`DEFAULT_CONNECT_TIMEOUT_SECONDS`) and a ``statement_timeout``
(:data:`DEFAULT_STATEMENT_TIMEOUT_SECONDS`) set for the session, unless the database URL sets
its own (``?connect_timeout=10&options=-c statement_timeout=60000``). The statement timeout
only bounds a statement while it runs: an idle session, such as the listener waiting for a
NOTIFY, is never cut by it. The engine also waits at most ``pool_timeout`` for a pooled
connection. A timeout is reported as :class:`~fleetledger.eventstore.errors.StoreTimeout`
(:func:`timeout_error`), naming the limit and what to do.

SQLite is a file: there is no network to wait on. Its one wait is for another writer's lock,
bounded by the busy timeout (``SQLITE_BUSY_TIMEOUT_SECONDS``), after which SQLite reports
"database is locked".
"""

from __future__ import annotations

import math
import os
import sqlite3
from typing import Any

import sqlalchemy as sa
from psycopg import errors as pg_errors
from psycopg.conninfo import make_conninfo
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from fleetledger.eventstore.errors import InvalidEvent, StoreTimeout

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_CONNECT_TIMEOUT_SECONDS",
    "DEFAULT_DATABASE_URL",
    "DEFAULT_POOL_TIMEOUT_SECONDS",
    "DEFAULT_STATEMENT_TIMEOUT_SECONDS",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "is_sqlite",
    "libpq_conninfo",
    "make_engine",
    "normalise_url",
    "resolve_url",
    "session_timeouts",
    "timeout_error",
]

DEFAULT_CONNECT_TIMEOUT_SECONDS = 5
"""How long opening a Postgres session may take: a reachable server answers in milliseconds."""
DEFAULT_STATEMENT_TIMEOUT_SECONDS = 30.0
"""How long one Postgres statement may run. The store's statements are small and paged; one
running this long is stuck (behind a lock, on an overloaded server), and its caller is better
told than kept waiting."""
DEFAULT_POOL_TIMEOUT_SECONDS = 10.0
"""How long the engine waits for one of its pooled connections to come free."""
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
"""How long a SQLite connection waits for another writer's lock before "database is locked"."""
_MIN_CONNECT_TIMEOUT_SECONDS = 2
"""libpq's (and psycopg's) floor: a smaller connect_timeout is taken as 2 seconds."""

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


def session_timeouts(
    url: URL,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT_SECONDS,
) -> dict[str, str]:
    """The libpq parameters that give a session to ``url`` these timeouts, in seconds, leaving
    out any the URL sets itself (its own ``connect_timeout``, or a ``statement_timeout`` in its
    ``options``); ``options`` keeps whatever else the URL's holds. ``statement_timeout=None``
    sets none. ``ValueError`` says which setting to fix."""
    if isinstance(connect_timeout, bool) or not (
        isinstance(connect_timeout, (int, float))
        and connect_timeout >= _MIN_CONNECT_TIMEOUT_SECONDS
    ):
        raise ValueError(
            f"connect_timeout must be a number of seconds, at least "
            f"{_MIN_CONNECT_TIMEOUT_SECONDS} (libpq's minimum), got {connect_timeout!r}"
        )
    if statement_timeout is not None and (
        isinstance(statement_timeout, bool)
        or not isinstance(statement_timeout, (int, float))
        or not 0.001 <= statement_timeout < math.inf
    ):
        raise ValueError(
            "statement_timeout must be a number of seconds, at least 0.001, or None for no "
            f"limit; got {statement_timeout!r}"
        )
    query = url.query
    given = query.get("options", "")
    options = " ".join(given) if isinstance(given, tuple) else given
    settings: dict[str, str] = {}
    if "connect_timeout" not in query:
        settings["connect_timeout"] = str(math.ceil(connect_timeout))
    if statement_timeout is not None and "statement_timeout" not in options:
        limit = f"-c statement_timeout={max(1, round(statement_timeout * 1000))}"
        settings["options"] = f"{options} {limit}".strip()
    return settings


def timeout_error(error: BaseException, *, doing: str, where: str) -> StoreTimeout | None:
    """The store's error for ``error`` (a driver's, or SQLAlchemy's wrapping one) when it is a
    timeout of this module's settings while ``doing`` on the database ``where``; ``None`` for
    any other error."""
    cause = getattr(error, "orig", None) or error
    if isinstance(cause, pg_errors.ConnectionTimeout):
        return StoreTimeout(
            f"cannot {doing} {where}: no answer to the connection within its connect_timeout; "
            "check that the database host is up and reachable from here (a firewall that "
            "drops packets looks the same), then retry",
            limit="connect_timeout",
        )
    if isinstance(cause, pg_errors.QueryCanceled) and "statement timeout" in str(cause):
        return StoreTimeout(
            f"cannot {doing} {where}: the statement ran past its statement_timeout and was "
            "cancelled, nothing of it was written; the database is overloaded or a lock is held "
            "by another session (see pg_stat_activity). Retry once it answers again, or raise "
            "the limit with '?options=-c statement_timeout=<ms>' in the database URL",
            limit="statement_timeout",
        )
    if isinstance(error, sa.exc.TimeoutError):
        return StoreTimeout(
            f"cannot {doing} {where}: every pooled connection stayed busy for the pool_timeout; "
            "the process runs more concurrent database calls than its pool holds, or they are "
            "stuck: retry, or give the store a larger pool",
            limit="pool_timeout",
        )
    return None


def libpq_conninfo(
    url: str | URL,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT_SECONDS,
) -> str:
    """The libpq connection string for a Postgres URL, for connections made without SQLAlchemy,
    with the session's timeouts (:func:`session_timeouts`).

    Built from the URL's parts rather than by re-rendering it: libpq does not read '+' in a
    URI's query as a space, so ``options=-c TimeZone=UTC`` would not survive the round trip.
    """
    parsed = normalise_url(url) if isinstance(url, str) else url
    timeouts = session_timeouts(
        parsed, connect_timeout=connect_timeout, statement_timeout=statement_timeout
    )
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
    parts.update(timeouts)
    return make_conninfo(**{k: v for k, v in parts.items() if v is not None})


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(
    url: str,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT_SECONDS,
    pool_timeout: float = DEFAULT_POOL_TIMEOUT_SECONDS,
    durable: bool = True,
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``; on Postgres its sessions have the timeouts given in seconds (see
    the module docstring; the URL's own settings win), and a timeout raises
    :class:`~fleetledger.eventstore.errors.StoreTimeout`. ``kwargs`` go to
    ``sqlalchemy.create_engine``. ``durable=False`` (scratch logs: a simulation's) lets a
    SQLite commit return before its write reaches the disk: it still survives the process
    crashing, not the machine losing power; Postgres takes its durability from the server (and
    the URL's ``options``)."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, durable=durable, **kwargs)
    if isinstance(pool_timeout, bool) or not (
        isinstance(pool_timeout, (int, float)) and 0 < pool_timeout < math.inf
    ):
        raise ValueError(f"pool_timeout must be a positive number of seconds, got {pool_timeout!r}")
    connect_args = {
        **session_timeouts(
            parsed, connect_timeout=connect_timeout, statement_timeout=statement_timeout
        ),
        **kwargs.pop("connect_args", {}),
    }
    engine = sa.create_engine(
        parsed,
        pool_pre_ping=True,
        pool_timeout=pool_timeout,
        connect_args=connect_args,
        **kwargs,
    )
    where = parsed.render_as_string(hide_password=True)

    @event.listens_for(engine, "handle_error")
    def _timeouts(context: sa.engine.ExceptionContext) -> None:
        # Raised in place of SQLAlchemy's wrapper: callers (the store's translation among them)
        # see the store's error, which says which limit was hit, rather than a generic
        # "database unreachable".
        timeout = timeout_error(context.original_exception, doing="use", where=where)
        if timeout is not None:
            raise timeout from context.original_exception

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


def _sqlite_engine(url: URL, *, durable: bool = True, **kwargs: Any) -> Engine:
    engine = sa.create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
        **kwargs,
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's implicit transactions are deferred and start late; we issue BEGIN ourselves
        # (see _begin) so the write lock is taken at the start of a write transaction.
        dbapi_connection.isolation_level = None
        _switch_to_wal(dbapi_connection)
        cursor = dbapi_connection.cursor()
        # FULL: an acknowledged append survives power loss, not only a process crash. OFF (WAL)
        # never waits for the disk — neither the fsync per commit nor the checkpoints' — and
        # still loses no committed transaction when only the process dies: the OS holds the
        # written pages. A scratch log is thrown away if the machine fails, so its runs need
        # not pay for that case.
        cursor.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine
