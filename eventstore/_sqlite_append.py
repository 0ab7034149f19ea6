"""The append algorithm for SQLite, run inside one ``BEGIN IMMEDIATE`` transaction.

It mirrors the Postgres ``fleetledger_append`` function (migrations/versions/0001): check every
request's idempotency and expected versions before writing anything, then write the requests that
passed. SQLite has a single writer, so the write lock gives global order = commit order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa

from eventstore._chain import GENESIS_HASH, chain_hash, epoch_micros
from eventstore._encoding import EXPECT_ANY, EXPECT_EXISTS, PreparedAppend
from eventstore._schema import events, streams
from eventstore._types import AppendResult
from eventstore.errors import DuplicateEventId, EventStoreError, WrongExpectedVersion

__all__ = ["AppendOutcome", "append_in_transaction"]

AppendOutcome = list[AppendResult] | EventStoreError


def append_in_transaction(
    conn: sa.Connection, items: Sequence[tuple[PreparedAppend, ...]], *, now: datetime
) -> list[AppendOutcome]:
    head = conn.execute(
        sa.select(events.c.global_position, events.c.hash)
        .order_by(events.c.global_position.desc())
        .limit(1)
    ).first()
    position, previous = (head[0], head[1]) if head else (0, GENESIS_HASH)
    now = now.astimezone(UTC)
    now_us = epoch_micros(now)
    outcomes: list[AppendOutcome] = []
    for item in items:
        checked = _check(conn, item)
        if checked is not None:
            outcomes.append(checked)
            continue
        results: list[AppendResult] = []
        rows: list[dict[str, object]] = []
        for append in item:
            version = _stream_version(conn, append.stream_id)
            first = position + 1
            for event in append.events:
                position += 1
                version += 1
                previous = chain_hash(
                    previous,
                    position=position,
                    stream_id=append.stream_id,
                    stream_version=version,
                    event_id=str(event.event_id),
                    type=event.type,
                    schema_version=event.schema_version,
                    recorded_at_us=now_us,
                    data_text=event.data_text,
                    metadata_text=event.metadata_text,
                )
                rows.append(
                    {
                        "global_position": position,
                        "stream_id": append.stream_id,
                        "stream_version": version,
                        "event_id": event.event_id,
                        "type": event.type,
                        "schema_version": event.schema_version,
                        "data": event.data_text,
                        "metadata": event.metadata_text,
                        "recorded_at": now,
                        "hash": previous,
                    }
                )
            _set_stream_version(conn, append.stream_id, version)
            results.append(AppendResult(first, position, version))
        conn.execute(events.insert(), rows)
        outcomes.append(results)
    return outcomes


def _check(conn: sa.Connection, item: tuple[PreparedAppend, ...]) -> AppendOutcome | None:
    """None when the item may be written; its original result when it is a faithful replay."""
    replayed: list[AppendResult] = []
    for append in item:
        ids = [e.event_id for e in append.events]
        stored = conn.execute(
            sa.select(
                events.c.event_id,
                events.c.stream_id,
                events.c.stream_version,
                events.c.global_position,
            ).where(events.c.event_id.in_(ids))
        ).all()
        if stored:
            replay = _replay_result(append, stored)
            if replay is None:
                by_id = {row[0] for row in stored}
                return DuplicateEventId(str(next(i for i in ids if i in by_id)))
            replayed.append(replay)
            continue
        actual = _stream_version(conn, append.stream_id)
        expected = append.expected
        if (expected >= 0 and actual != expected) or (expected == EXPECT_EXISTS and actual == 0):
            return WrongExpectedVersion(append.stream_id, append.expected_label, actual)
    if replayed and len(replayed) < len(item):
        stored_id = next(
            e.event_id
            for a in item
            for e in a.events
            if conn.execute(sa.select(events.c.event_id).where(events.c.event_id == e.event_id))
            .first()
        )
        return DuplicateEventId(str(stored_id))
    return replayed or None


def _replay_result(append: PreparedAppend, stored: Sequence[sa.Row[tuple[object, ...]]]) -> AppendResult | None:
    by_id = {row[0]: row for row in stored}
    rows = [by_id.get(e.event_id) for e in append.events]
    if any(row is None for row in rows):
        return None
    first_version = int(rows[0][2])  # type: ignore[index]
    for offset, row in enumerate(rows):
        assert row is not None
        if row[1] != append.stream_id or int(row[2]) != first_version + offset:  # type: ignore[call-overload]
            return None
    if append.expected not in (EXPECT_ANY, EXPECT_EXISTS) and first_version != append.expected + 1:
        return None
    first_position = int(rows[0][3])  # type: ignore[index]
    return AppendResult(first_position, first_position + len(rows) - 1, first_version + len(rows) - 1)


def _stream_version(conn: sa.Connection, stream_id: str) -> int:
    version = conn.execute(
        sa.select(streams.c.version).where(streams.c.stream_id == stream_id)
    ).scalar_one_or_none()
    return int(version or 0)


def _set_stream_version(conn: sa.Connection, stream_id: str, version: int) -> None:
    updated = conn.execute(
        streams.update().where(streams.c.stream_id == stream_id).values(version=version)
    )
    if updated.rowcount == 0:
        conn.execute(
            streams.insert().values(
                stream_id=stream_id, version=version, category=stream_id.split("-", 1)[0]
            )
        )
