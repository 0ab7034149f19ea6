"""Group commit on Postgres: optimistic planning on a cached view, one statement per commit.

Why no lock: global_position has a unique index, and every writer places its rows at the head it
knows + 1. A writer only knows a head that has committed (it read it, or committed it itself), so
position p + 1 can only be attempted once p is committed: two writers aiming at the same position
meet on the index, the second waits for the first's commit and then fails with a unique
violation. Global position order is therefore commit order, and a reader tailing
``position > checkpoint`` can never skip an event that commits later with a lower position — the
same guarantee an advisory lock would give, without its extra statement on every append.

A stale view (another process appended meanwhile) shows up as a unique violation on position,
stream version or event id; the appender then reads a fresh view — head, the group's stream
versions and whichever of its event ids are stored — in one query and plans again. A rejection
planned from the cache is never trusted: it is re-checked against a fresh view first. In steady
state (one controller process writing) an append is one round trip: one INSERT … RETURNING-free
statement that also updates the streams table and sends the NOTIFY wake-up, committed at once.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from eventstore._encoding import PreparedAppend
from eventstore._planner import AppendOutcome, GroupPlan, LogView, StoredEvent, plan_group
from eventstore.errors import StoreUnavailable

__all__ = ["NOTIFY_CHANNEL", "PostgresAppender"]

NOTIFY_CHANNEL = "fleetledger_events"
MAX_ATTEMPTS = 50
MAX_CACHED_STREAMS = 100_000

_INSERT_ARRAYS = f"""
WITH new_events AS (
  INSERT INTO events (global_position, stream_id, stream_version, event_id, type, schema_version,
                      data, metadata, recorded_at, hash)
  SELECT * FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::uuid[], %b::text[],
                       %b::int[], %b::text[]::json[], %b::text[]::json[], %b::timestamptz[],
                       %b::bytea[])
), new_versions AS (
  INSERT INTO streams (stream_id, version, category)
  SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[])
  ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version
)
SELECT pg_notify('{NOTIFY_CHANNEL}', %b::text)
"""
# Small groups (the common case: one caller, one event) use plain VALUES with scalar parameters,
# which the driver encodes in C; array parameters cost more to encode than the rest of the append.
SMALL_GROUP_ROWS = 8
_EVENT_VALUES = "(%b, %b, %b, %b, %b, %b, %b::text::json, %b::text::json, %b, %b)"
_STREAM_VALUES = "(%b, %b, %b)"


@functools.cache
def _insert_values(rows: int, streams: int) -> str:
    return f"""
WITH new_events AS (
  INSERT INTO events (global_position, stream_id, stream_version, event_id, type, schema_version,
                      data, metadata, recorded_at, hash)
  VALUES {", ".join([_EVENT_VALUES] * rows)}
), new_versions AS (
  INSERT INTO streams (stream_id, version, category)
  VALUES {", ".join([_STREAM_VALUES] * streams)}
  ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version
)
SELECT pg_notify('{NOTIFY_CHANNEL}', %b::text)
"""


_VIEW = """
SELECT head.global_position, head.hash,
       (SELECT json_object_agg(stream_id, version) FROM streams WHERE stream_id = ANY(%s)),
       (SELECT json_agg(json_build_array(event_id, stream_id, stream_version, global_position))
          FROM events WHERE event_id = ANY(%s))
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (SELECT global_position, hash FROM events
                      ORDER BY global_position DESC LIMIT 1) AS head ON true
"""


class PostgresAppender:
    """Commits groups of appends on its own autocommit connection; one instance per store."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._connection: psycopg.Connection[Any] | None = None
        self._view: LogView | None = None
        self._lock = threading.Lock()

    def commit(self, items: Sequence[tuple[PreparedAppend, ...]]) -> list[AppendOutcome]:
        with self._lock:
            try:
                return self._commit(items)
            except BaseException:
                # After any failure the outcome may be unknown: start from a fresh connection and
                # a fresh view. Callers retry with the same event ids, which is idempotent.
                self._view = None
                self.close()
                raise

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _commit(self, items: Sequence[tuple[PreparedAppend, ...]]) -> list[AppendOutcome]:
        stream_ids = sorted({a.stream_id for item in items for a in item})
        view = self._cached_view(stream_ids)
        fresh = view is None
        for _ in range(MAX_ATTEMPTS):
            if view is None:
                view = self._read_view(stream_ids, items)
                fresh = True
            plan = plan_group(items, view, now=datetime.now(UTC))
            if plan.has_rejections and not fresh:
                view = None
                continue
            if plan.rows:
                try:
                    self._insert(plan)
                except pg_errors.UniqueViolation:
                    view = None
                    continue
            view.advance(plan)
            self._remember(view)
            return list(plan.outcomes)
        raise StoreUnavailable(
            f"gave up after {MAX_ATTEMPTS} attempts: other processes keep appending at the same "
            "positions. Run one writing controller per database (see the leader election docs)"
        )

    def _cached_view(self, stream_ids: Sequence[str]) -> LogView | None:
        view = self._view
        if view is None or any(s not in view.versions for s in stream_ids):
            return None
        return view

    def _remember(self, view: LogView) -> None:
        if len(view.versions) > MAX_CACHED_STREAMS:
            view.versions = {}
        self._view = view

    def _conn(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._conninfo, autocommit=True)
        return self._connection

    def _read_view(
        self, stream_ids: Sequence[str], items: Sequence[tuple[PreparedAppend, ...]]
    ) -> LogView:
        ids = [e.event_id for item in items for a in item for e in a.events]
        row = self._conn().execute(_VIEW, (list(stream_ids), ids), prepare=True).fetchone()
        assert row is not None
        position, digest, versions, stored = row
        cached = self._view.versions if self._view is not None else {}
        view = LogView(versions=dict(cached))
        if position is not None:
            view.head_position, view.head_hash = int(position), bytes(digest)
        view.versions.update({s: 0 for s in stream_ids})
        view.versions.update({s: int(v) for s, v in (versions or {}).items()})
        for event_id, stream_id, version, at in stored or ():
            view.stored[uuid.UUID(event_id)] = StoredEvent(stream_id, int(version), int(at))
        return view

    def _insert(self, plan: GroupPlan) -> None:
        rows = plan.rows
        versions = plan.stream_versions
        head = str(rows[-1].global_position)
        if len(rows) <= SMALL_GROUP_ROWS:
            params: list[Any] = []
            for r in rows:
                params += (
                    r.global_position,
                    r.stream_id,
                    r.stream_version,
                    r.event_id,
                    r.type,
                    r.schema_version,
                    r.data_text,
                    r.metadata_text,
                    r.recorded_at,
                    r.hash,
                )
            for stream_id, version in versions.items():
                params += (stream_id, version, _category(stream_id))
            params.append(head)
            self._conn().execute(_insert_values(len(rows), len(versions)), params, prepare=True)
            return
        self._conn().execute(
            _INSERT_ARRAYS,
            (
                [r.global_position for r in rows],
                [r.stream_id for r in rows],
                [r.stream_version for r in rows],
                [r.event_id for r in rows],
                [r.type for r in rows],
                [r.schema_version for r in rows],
                [r.data_text for r in rows],
                [r.metadata_text for r in rows],
                [r.recorded_at for r in rows],
                [r.hash for r in rows],
                list(versions),
                list(versions.values()),
                [_category(s) for s in versions],
                head,
            ),
            prepare=True,
        )


def _category(stream_id: str) -> str:
    return stream_id.split("-", 1)[0]
