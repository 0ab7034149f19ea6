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
import json
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from eventstore._chain import GENESIS_HASH
from eventstore._encoding import PreparedAppend
from eventstore._planner import AppendOutcome, GroupPlan, LogView, StoredEvent, plan_group
from eventstore.errors import StoreUnavailable

__all__ = ["NOTIFY_CHANNEL", "PostgresAppender"]

NOTIFY_CHANNEL = "fleetledger_events"
MAX_ATTEMPTS = 50
MAX_CACHED_STREAMS = 100_000

# The whole group travels as ONE text parameter: a JSON array with one object per row, assembled
# from the canonical texts the planner already holds. Per-parameter encoding in the driver costs
# more than the rest of an append, so ten parameters per row were the bottleneck of group commit.
# The bodies are embedded verbatim; ``json_to_recordset`` hands a ``json`` field back as its exact
# source text — the text the hash chain covers (verify() would notice otherwise).
_INSERT = f"""
WITH batch AS (
  SELECT * FROM json_to_recordset(%b::text::json)
    AS r(p bigint, s text, v bigint, i uuid, t text, sv int, d json, m json, at timestamptz,
         h text)
), new_events AS (
  INSERT INTO events (global_position, stream_id, stream_version, event_id, type, schema_version,
                      data, metadata, recorded_at, hash)
  SELECT p, s, v, i, t, sv, d, m, at, decode(h, 'hex') FROM batch
), new_streams AS (
  INSERT INTO streams (stream_id, category, first_position)
  SELECT s, split_part(s, '-', 1), p FROM batch WHERE v = 1
  ON CONFLICT (stream_id) DO NOTHING
)
SELECT pg_notify('{NOTIFY_CHANNEL}', (SELECT max(p) FROM batch)::text)
"""

_VIEW = """
SELECT head.global_position, head.hash,
       (SELECT json_object_agg(sid, (SELECT stream_version FROM events
                                      WHERE stream_id = sid
                                      ORDER BY stream_version DESC LIMIT 1))
          FROM unnest(%s::text[]) AS sid),
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
        self._cursor: psycopg.Cursor[Any] | None = None
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
            self._cursor = None

    def _commit(self, items: Sequence[tuple[PreparedAppend, ...]]) -> list[AppendOutcome]:
        # A stream the cached view has not seen is planned at version 0: a new stream (the
        # common case: every batch opens one) then costs no extra read, and if it did exist the
        # insert collides on (stream_id, stream_version) and the view is refreshed like any
        # other stale view.
        view = self._view
        fresh = False
        for _ in range(MAX_ATTEMPTS):
            if view is None:
                view = self._refresh_view(items)
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
            if len(view.versions) > MAX_CACHED_STREAMS:
                view.versions = {}
            self._view = view
            return list(plan.outcomes)
        raise StoreUnavailable(
            f"gave up after {MAX_ATTEMPTS} attempts: other processes keep appending at the same "
            "positions. Run one writing controller per database (see the leader election docs)"
        )

    def _cur(self) -> psycopg.Cursor[Any]:
        # One long-lived cursor: creating a cursor per statement is a visible share of an append.
        if self._cursor is None or self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._conninfo, autocommit=True)
            self._cursor = self._connection.cursor()
        return self._cursor

    def _refresh_view(self, items: Sequence[tuple[PreparedAppend, ...]]) -> LogView:
        """Read the head, the group's stream versions and its stored ids into the cached view
        (one query, one snapshot); other streams keep their cached versions."""
        stream_ids = sorted({a.stream_id for item in items for a in item})
        ids = [e.event_id for item in items for a in item for e in a.events]
        row = self._cur().execute(_VIEW, (stream_ids, ids), prepare=True).fetchone()
        assert row is not None
        position, digest, versions, stored = row
        view = self._view if self._view is not None else LogView()
        view.head_position, view.head_hash = (
            (int(position), bytes(digest)) if position is not None else (0, GENESIS_HASH)
        )
        for stream_id in stream_ids:
            found = (versions or {}).get(stream_id)
            view.versions[stream_id] = 0 if found is None else int(found)
        view.stored = {
            uuid.UUID(event_id): StoredEvent(stream_id, int(version), int(at))
            for event_id, stream_id, version, at in stored or ()
        }
        return view

    def _insert(self, plan: GroupPlan) -> None:
        recorded_at = plan.rows[0].recorded_at.isoformat()
        payload = ",".join(
            f'{{"p":{r.global_position},"s":{_json_string(r.stream_id)},"v":{r.stream_version},'
            f'"i":"{r.event_id}","t":{_json_string(r.type)},"sv":{r.schema_version},'
            f'"d":{r.data_text},"m":{r.metadata_text},"at":"{recorded_at}","h":"{r.hash.hex()}"}}'
            for r in plan.rows
        )
        self._cur().execute(_INSERT, (f"[{payload}]",), prepare=True)


@functools.lru_cache(maxsize=8192)
def _json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)
