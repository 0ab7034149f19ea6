"""Reads on Postgres: one statement per page on the reader's own connections.

Replay reads the log a page at a time and every aggregate load reads its stream, so a page costs
exactly one round trip here. Through the SQLAlchemy pool it cost three: the
checkout's liveness ping, the page itself, and the rollback ending its transaction — together a
fifth of a replay of small events (``fleetledger bench store`` measures it against raw psycopg).
These connections are autocommit and are configured once when opened instead.

Liveness is checked by use instead: a page that fails on a connection that had sat idle (the
server may have restarted or killed it meanwhile) is read once more on a new one, which is safe
because reading is idempotent. A failure on a new connection is the caller's to see.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg

__all__ = ["PostgresReader"]

# The last column: whether the row's bodies may hold an integer orjson cannot read exactly, a run
# of 19 digits (eventstore/_sql.py says why, and decodes such a page with the exact decoder).
# Postgres's engine looks for it in the text it sends anyway, on the server's core, for less than
# the searching cost this process per page.
_SELECT = (
    "SELECT global_position, stream_id, stream_version, event_id, type, schema_version, "
    "data::text, metadata::text, recorded_at, hash, "
    "data::text ~ '[0-9]{19}' OR metadata::text ~ '[0-9]{19}' FROM events "
)
_PAGE = _SELECT + "WHERE global_position > %s ORDER BY global_position LIMIT %s"
_PAGE_OF_TYPES = (
    _SELECT + "WHERE global_position > %s AND type = ANY(%s) ORDER BY global_position LIMIT %s"
)
_HEAD = "SELECT coalesce(max(global_position), 0) FROM events"
# LIMIT NULL is no limit.
_STREAM = _SELECT + "WHERE stream_id = %s AND stream_version >= %s ORDER BY stream_version LIMIT %s"
_STREAM_BACKWARDS = (
    _SELECT + "WHERE stream_id = %s AND stream_version <= %s ORDER BY stream_version DESC LIMIT %s"
)

# Timestamps come back in UTC whatever the server's TimeZone (psycopg then uses
# datetime.timezone.utc, much cheaper per row than a ZoneInfo). Reading in position order is
# always a primary-key range scan, but until autovacuum has analysed a young (or freshly loaded)
# log the planner guesses a sequential scan plus sort, twenty times slower per page; these
# connections run nothing else, so ruling it out for the session is safe.
_SESSION = "SET TimeZone TO 'UTC'; SET enable_seqscan TO off"


class PostgresReader:
    """Pages of the global log as rows; thread-safe, keeps up to ``max_idle`` connections."""

    def __init__(self, conninfo: str, *, max_idle: int) -> None:
        self._conninfo = conninfo
        self._max_idle = max_idle
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    def read_all(
        self, *, after: int, limit: int, types: Sequence[str] | None
    ) -> list[tuple[Any, ...]]:
        """Rows of the ten event columns (bodies as text), and whether the row's bodies may hold
        a big integer, with ``global_position > after``."""
        if types is None:
            return self._fetch(_PAGE, (after, limit))
        # Planned for its own types each time, never from a cached generic plan: which index
        # serves a page depends on how common the types are. Once prepared, Postgres settles on
        # a plan made without them, and one settled while the log was young walks the primary
        # key filtering by type: for a reader of rare types, the whole log after its position on
        # every page (a live serve spent most of its database time on it). Planning costs a
        # fraction of a millisecond per page.
        return self._fetch(_PAGE_OF_TYPES, (after, list(types), limit), prepare=False)

    def head(self) -> int:
        """The position of the log's last event (0 for an empty log)."""
        [(position,)] = self._fetch(_HEAD, ())
        return int(position)

    def read_stream(
        self, stream_id: str, *, from_version: int, backwards: bool, limit: int | None
    ) -> list[tuple[Any, ...]]:
        """Rows of one stream from ``from_version`` on (down, with ``backwards``)."""
        sql = _STREAM_BACKWARDS if backwards else _STREAM
        return self._fetch(sql, (stream_id, from_version, limit))

    def _fetch(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool = True
    ) -> list[tuple[Any, ...]]:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is not None:
            try:
                return self._page(connection, sql, params, prepare)
            except psycopg.OperationalError:
                pass  # it died while idle: read again on a new connection
        return self._page(self._connect(), sql, params, prepare)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _page(
        self, connection: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], prepare: bool
    ) -> list[tuple[Any, ...]]:
        try:
            # Binary results: numbers, UUIDs, timestamps and the hash arrive without parsing.
            with connection.cursor(binary=True) as cursor:
                rows = cursor.execute(sql, params, prepare=prepare).fetchall()
        except BaseException:
            connection.close()
            raise
        with self._lock:
            keep = not self._closed and len(self._idle) < self._max_idle
            if keep:
                self._idle.append(connection)
        if not keep:
            connection.close()
        return rows

    def _connect(self) -> psycopg.Connection[Any]:
        connection = psycopg.connect(self._conninfo, autocommit=True, client_encoding="utf8")
        try:
            connection.execute(_SESSION)
        except BaseException:
            connection.close()
            raise
        return connection
