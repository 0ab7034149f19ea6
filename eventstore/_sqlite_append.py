"""Group commit on SQLite: read the view and write the plan inside one ``BEGIN IMMEDIATE``.

SQLite has one writer at a time, so the view read under the write lock is exact and global order
equals commit order without further care. The same holds for fencing: the recorded leader terms
(log-wide, and those of the shards the group names) are read, judged and raised inside that write
transaction, so no append from a deposed term can slip in between an election and the check.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from fleetledger.eventstore._chain import from_epoch_micros
from fleetledger.eventstore._encoding import PreparedAppend
from fleetledger.eventstore._planner import (
    AppendOutcome,
    GroupPlan,
    LogView,
    StoredEvent,
    plan_group,
)
from fleetledger.eventstore._schema import fencing, shard_fencing

__all__ = ["append_in_transaction"]


def append_in_transaction(
    conn: sa.Connection, items: Sequence[tuple[PreparedAppend, ...]], *, recorded_us: int
) -> list[AppendOutcome]:
    view = _read_view(conn, items)
    plan = plan_group(items, view, recorded_us=recorded_us)
    if plan.rows:
        recorded_at = _stored_datetime(recorded_us)
        conn.exec_driver_sql(
            _INSERT_EVENTS,
            [
                (
                    r.global_position,
                    r.stream_id,
                    r.stream_version,
                    r.event.event_id_bytes.hex(),
                    r.event.type,
                    r.event.schema_version,
                    r.event.data_text,
                    r.event.metadata_text,
                    recorded_at,
                    r.hash,
                )
                for r in plan.rows
            ],
        )
        new_streams = [
            (r.stream_id, r.stream_id.split("-", 1)[0], r.global_position)
            for r in plan.rows
            if r.stream_version == 1
        ]
        if new_streams:
            conn.exec_driver_sql(_INSERT_STREAMS, new_streams)
    if plan.term != view.term:
        conn.execute(fencing.update().values(term=plan.term))
    if plan.shards:
        _record_shard_terms(conn, plan, view)
    return list(plan.outcomes)


def _record_shard_terms(conn: sa.Connection, plan: GroupPlan, view: LogView) -> None:
    """Upsert the terms the plan raised (a shard's first append creates its row)."""
    raised = [
        {"shard": shard, "term": span.last}
        for shard, span in plan.shards.items()
        if span.last != view.shard_terms.get(shard, 0)
    ]
    if raised:
        upsert = sqlite.insert(shard_fencing)
        conn.execute(
            upsert.on_conflict_do_update(
                index_elements=[shard_fencing.c.shard], set_={"term": upsert.excluded.term}
            ),
            raised,
        )


# The rows go to the driver as plain tuples in the forms SQLAlchemy's column types store on
# SQLite (the id as 32 hex digits, the time as its DATETIME text): building each row's parameters
# through the table's types took as long as the rest of a commit. tests/eventstore checks the
# stored forms read back through the column types (test_sqlite_append), ``verify`` the chain.
_INSERT_EVENTS = (
    "INSERT INTO events (global_position, stream_id, stream_version, event_id, type, "
    "schema_version, data, metadata, recorded_at, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_STREAMS = "INSERT INTO streams (stream_id, category, first_position) VALUES (?, ?, ?)"
_HEAD = "SELECT global_position, hash FROM events ORDER BY global_position DESC LIMIT 1"


def _stored_datetime(epoch_us: int) -> str:
    """``epoch_us`` as SQLAlchemy's SQLite ``DATETIME`` stores a UTC time (no zone, always six
    digits of microseconds)."""
    at = from_epoch_micros(epoch_us)
    return (
        f"{at.year:04d}-{at.month:02d}-{at.day:02d} "
        f"{at.hour:02d}:{at.minute:02d}:{at.second:02d}.{at.microsecond:06d}"
    )


@functools.cache
def _stored_ids_sql(count: int) -> str:
    marks = ", ".join(["?"] * count)
    return (
        "SELECT event_id, stream_id, stream_version, global_position FROM events "
        f"WHERE event_id IN ({marks})"
    )


_HEADS_PER_STATEMENT = 500
"""Streams whose heads one statement reads (SQLite allows 32,766 parameters)."""


@functools.cache
def _heads_sql(count: int) -> str:
    # One statement for every stream of the group: each row's max() is a correlated subquery
    # over the (stream_id, stream_version) index prefix, a single index probe — a GROUP BY
    # would walk each stream's whole index range instead.
    values = ", ".join(["(?)"] * count)
    return (
        f"WITH wanted(stream_id) AS (VALUES {values}) "
        "SELECT stream_id, (SELECT max(e.stream_version) FROM events AS e "
        "WHERE e.stream_id = wanted.stream_id) FROM wanted"
    )


def _read_view(conn: sa.Connection, items: Sequence[tuple[PreparedAppend, ...]]) -> LogView:
    view = LogView()
    head = conn.exec_driver_sql(_HEAD).first()
    if head is not None:
        view.head_position, view.head_hash = int(head[0]), bytes(head[1])
    termed = [a for item in items for a in item if a.last_term]
    if termed:
        # Only a group carrying terms is judged by, or moves, the recorded ones it names.
        _read_terms(conn, termed, view)
    stream_ids = sorted({a.stream_id for item in items for a in item})
    for start in range(0, len(stream_ids), _HEADS_PER_STATEMENT):
        chunk = stream_ids[start : start + _HEADS_PER_STATEMENT]
        view.versions.update(
            (str(stream_id), int(version))
            for stream_id, version in conn.exec_driver_sql(_heads_sql(len(chunk)), tuple(chunk))
            if version is not None
        )
    canonical = {
        e.event_id_bytes.hex(): e.event_id for item in items for a in item for e in a.events
    }
    hex_ids = list(canonical)
    for start in range(0, len(hex_ids), _HEADS_PER_STATEMENT):
        chunk = hex_ids[start : start + _HEADS_PER_STATEMENT]
        for event_id, stream_id, version, position in conn.exec_driver_sql(
            _stored_ids_sql(len(chunk)), tuple(chunk)
        ):
            view.stored[canonical[event_id]] = StoredEvent(stream_id, int(version), int(position))
    return view


def _read_terms(conn: sa.Connection, termed: Sequence[PreparedAppend], view: LogView) -> None:
    """The recorded log-wide term if an append of ``termed`` is fenced on it, and those of the
    shards they name (a shard without a row is at term 0, which the view's default says)."""
    if any(a.shard is None for a in termed):
        view.term = int(conn.execute(sa.select(fencing.c.term)).scalar() or 0)
    shards = sorted({a.shard for a in termed if a.shard is not None})
    if shards:
        view.shard_terms.update(
            (str(shard), int(term))
            for shard, term in conn.execute(
                sa.select(shard_fencing.c.shard, shard_fencing.c.term).where(
                    shard_fencing.c.shard.in_(shards)
                )
            )
        )
