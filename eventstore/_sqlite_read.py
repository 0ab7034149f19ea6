"""Reads on SQLite: one statement per page, its rows converted here rather than by SQLAlchemy.

SQLAlchemy's result processing turned each row's event id into a ``uuid.UUID`` through its
constructor (which parses the text its own general way) and its time from text, in Python, row
by row: most of a replay's reading on SQLite (``fleetledger bench replay``). The statements are
sent as they are (``exec_driver_sql``: SQLAlchemy still begins the transaction and translates the
driver's errors), the rows come back untyped, and the two columns are converted here: the id from
its 32 hex digits straight into a UUID, the time parsed once per distinct text (a commit's events
share one).

The rows have the shape ``_sql._recorded_page`` reads: the ten event columns, then ``None`` for
"not checked for big integers" (Postgres checks as it reads; on SQLite the page is searched).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

__all__ = ["read_all", "read_stream"]

_SELECT = (
    "SELECT global_position, stream_id, stream_version, event_id, type, schema_version, "
    "data, metadata, recorded_at, hash FROM events "
)
_PAGE = _SELECT + "WHERE global_position > ? ORDER BY global_position LIMIT ?"
_STREAM = _SELECT + "WHERE stream_id = ? AND stream_version >= ? ORDER BY stream_version"
_STREAM_BACKWARDS = (
    _SELECT + "WHERE stream_id = ? AND stream_version <= ? ORDER BY stream_version DESC"
)

Row = tuple[Any, ...]


def read_all(
    conn: sa.Connection, *, after: int, limit: int, types: Sequence[str] | None
) -> list[Row]:
    """Rows with ``global_position > after`` (of ``types``, if given), in log order."""
    if types is None:
        return _rows(conn.exec_driver_sql(_PAGE, (after, limit)))
    if not types:
        return []
    of_types = (
        _SELECT + "WHERE global_position > ? AND type IN "
        f"({', '.join('?' * len(types))}) ORDER BY global_position LIMIT ?"
    )
    return _rows(conn.exec_driver_sql(of_types, (after, *types, limit)))


def read_stream(
    conn: sa.Connection, stream_id: str, *, from_version: int, backwards: bool, limit: int | None
) -> list[Row]:
    """Rows of one stream from ``from_version`` on (down, with ``backwards``)."""
    sql = _STREAM_BACKWARDS if backwards else _STREAM
    if limit is None:
        return _rows(conn.exec_driver_sql(sql, (stream_id, from_version)))
    return _rows(conn.exec_driver_sql(sql + " LIMIT ?", (stream_id, from_version, limit)))


def _rows(result: sa.CursorResult[Any]) -> list[Row]:
    fetched: Sequence[Any] = result.all()
    rows: list[Row] = []
    append = rows.append
    parsed_text: str | None = None
    parsed = None
    for position, stream, version, event_id, type_, schema, data, metadata, at, digest in fetched:
        if at != parsed_text:
            parsed_text, parsed = at, datetime.fromisoformat(at)
        append(
            (
                position,
                stream,
                version,
                _event_id(event_id),
                type_,
                schema,
                data,
                metadata,
                parsed,
                digest,
                None,
            )
        )
    return rows


_new = object.__new__
_set = object.__setattr__
_UUID = uuid.UUID
_UNKNOWN = uuid.SafeUUID.unknown


def _event_id(text: str) -> uuid.UUID:
    """The UUID SQLAlchemy stored as 32 hex digits, built as ``uuid.UUID(hex=text)`` builds it
    (its number and its unknown safety); any other text goes through that constructor."""
    if len(text) != 32 or not text.isalnum():
        return _UUID(text)
    try:
        number = int(text, 16)
    except ValueError:
        return _UUID(text)
    made: uuid.UUID = _new(_UUID)
    _set(made, "int", number)
    _set(made, "is_safe", _UNKNOWN)
    return made
