"""Group commit on SQLite: read the view and write the plan inside one ``BEGIN IMMEDIATE``.

SQLite has one writer at a time, so the view read under the write lock is exact and global order
equals commit order without further care. The same holds for fencing: the recorded leader term is
read, judged and raised inside that write transaction, so no append from a deposed term can slip
in between an election and the check.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from fleetledger.eventstore._chain import from_epoch_micros
from fleetledger.eventstore._encoding import PreparedAppend
from fleetledger.eventstore._planner import AppendOutcome, LogView, StoredEvent, plan_group
from fleetledger.eventstore._schema import events, fencing, streams

__all__ = ["append_in_transaction"]


def append_in_transaction(
    conn: sa.Connection, items: Sequence[tuple[PreparedAppend, ...]], *, recorded_us: int
) -> list[AppendOutcome]:
    view = _read_view(conn, items)
    plan = plan_group(items, view, recorded_us=recorded_us)
    recorded_at = from_epoch_micros(recorded_us)
    if plan.rows:
        conn.execute(
            events.insert(),
            [
                {
                    "global_position": r.global_position,
                    "stream_id": r.stream_id,
                    "stream_version": r.stream_version,
                    "event_id": uuid.UUID(bytes=r.event.event_id_bytes),
                    "type": r.event.type,
                    "schema_version": r.event.schema_version,
                    "data": r.event.data_text,
                    "metadata": r.event.metadata_text,
                    "recorded_at": recorded_at,
                    "hash": r.hash,
                }
                for r in plan.rows
            ],
        )
        new_streams = [
            {
                "stream_id": r.stream_id,
                "category": r.stream_id.split("-", 1)[0],
                "first_position": r.global_position,
            }
            for r in plan.rows
            if r.stream_version == 1
        ]
        if new_streams:
            conn.execute(streams.insert(), new_streams)
    if plan.term != view.term:
        conn.execute(fencing.update().values(term=plan.term))
    return list(plan.outcomes)


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
    head = conn.execute(
        sa.select(events.c.global_position, events.c.hash)
        .order_by(events.c.global_position.desc())
        .limit(1)
    ).first()
    if head is not None:
        view.head_position, view.head_hash = int(head[0]), bytes(head[1])
    if any(a.last_term for item in items for a in item):
        # Only a group carrying terms is judged by, or moves, the recorded one.
        view.term = int(conn.execute(sa.select(fencing.c.term)).scalar() or 0)
    stream_ids = sorted({a.stream_id for item in items for a in item})
    for start in range(0, len(stream_ids), _HEADS_PER_STATEMENT):
        chunk = stream_ids[start : start + _HEADS_PER_STATEMENT]
        view.versions.update(
            (str(stream_id), int(version))
            for stream_id, version in conn.exec_driver_sql(_heads_sql(len(chunk)), tuple(chunk))
            if version is not None
        )
    ids = [uuid.UUID(bytes=e.event_id_bytes) for item in items for a in item for e in a.events]
    for event_id, stream_id, version, position in conn.execute(
        sa.select(
            events.c.event_id, events.c.stream_id, events.c.stream_version, events.c.global_position
        ).where(events.c.event_id.in_(ids))
    ):
        view.stored[str(event_id)] = StoredEvent(stream_id, int(version), int(position))
    return view
