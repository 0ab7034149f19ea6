"""Group commit on Postgres: optimistic planning on a cached view, one statement per commit.

Why no lock: global_position has a unique index, and every writer places its rows at the head it
knows + 1. A writer only knows a head that has committed (it read it, or committed it itself), so
position p + 1 can only be attempted once p is committed: two writers aiming at the same position
meet on the index, the second waits for the first's commit and then fails with a unique
violation. Global position order is therefore commit order, and a reader tailing
``position > checkpoint`` can never skip an event that commits later with a lower position — the
same guarantee an advisory lock would give, without its extra statement on every append.

A stale view (another process appended meanwhile) shows up as a unique violation on position,
stream version or event id, or — when another process raised the leader term, log-wide or of a
shard — as the fence's refusal (SQLSTATE ``LT001``, migrations 0002 and 0005); the appender then
reads a fresh view — head, recorded term, the recorded terms of the group's shards, the group's
stream versions and whichever of its event ids are stored — in one query and plans again, which
refuses exactly the callers whose term is stale as ``Fenced``.
A rejection planned from the cache is never trusted: it is re-checked against a fresh view
first. In steady state (one controller process writing) an append is one round trip: one INSERT
statement (which also registers a stream it opens), committed at once; ``on_commit`` then
arranges the wake-up for other processes.

The statements are prepared once per connection and executed through psycopg's libpq binding
(``pgconn.exec_prepared``) rather than a cursor: their parameters are encoded here already and
they return nothing, so the cursor's adaptation and result machinery would be pure overhead —
about a third of the client's time per append, which ``bench store`` shows. libpq releases the
GIL while it waits, so other writers keep queueing meanwhile.
"""

from __future__ import annotations

import functools
import json
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq

from fleetledger.eventstore._chain import GENESIS_HASH, from_epoch_micros, now_micros
from fleetledger.eventstore._encoding import PreparedAppend
from fleetledger.eventstore._libpq import check_result
from fleetledger.eventstore._planner import (
    AppendOutcome,
    EventRow,
    GroupPlan,
    LogView,
    StoredEvent,
    plan_group,
)
from fleetledger.eventstore.errors import StoreUnavailable

__all__ = ["NOTIFY_CHANNEL", "PostgresAppender"]

NOTIFY_CHANNEL = "fleetledger_events"
MAX_ATTEMPTS = 50
MAX_CACHED_STREAMS = 100_000
FENCED_SQLSTATE = b"LT001"
"""What ``fleetledger_fence`` and ``fleetledger_fence_shards`` raise (migrations 0002, 0005)."""

# Prepared statements, each one round trip that inserts the group's rows:
#
# - a lone row of an existing stream — every append of a lone writer — goes as parameters
#   straight into the columns with a plain INSERT, the cheapest form the server runs (a
#   data-modifying CTE costs about a tenth more per commit, measured with pgbench);
# - several rows travel as ONE text parameter, a JSON array with one object per row assembled from
#   the canonical texts the planner already holds, so a group of any size is one statement;
# - a group that opens a stream also registers it in ``streams``, in a CTE beside the insert;
# - a group whose rows carry leader terms has the database fence them in the same statement:
#   ``fleetledger_fence(first, last)`` takes the fencing row's lock (and raises the recorded
#   term, or refuses the statement) before any row is produced. Only fenced groups pay for it;
# - rows naming shards are fenced alike by ``fleetledger_fence_shards(shards, firsts, lasts)``,
#   one lock per shard; a group carrying log-wide terms as well calls ``fleetledger_fence``
#   first (the shards' fence reads through its CTE), so every statement takes the fencing row
#   before the shard rows, which the function takes in sorted order (migration 0005).
#
# ``json`` columns keep their input text verbatim, and ``json_to_recordset`` hands a ``json`` field
# back as its exact source text: the stored bodies are the texts the hash chain covers (verify()
# would notice otherwise). The NOTIFY wake-up for other processes is not part of the commit: it
# follows it (see ``_wakeups.py``).
_COLUMNS = """global_position, stream_id, stream_version, event_id, type, schema_version, data,
                    metadata, recorded_at, hash"""
_ROWS_FROM_JSON = """json_to_recordset($1::text::json)
    AS r(p bigint, s text, v bigint, i uuid, t text, sv int, d json, m json, at timestamptz,
         h text)"""

# Type OIDs and wire formats of the binary parameters (fixed by the Postgres protocol).
_INT4, _INT8, _TEXT, _UUID, _JSON, _TIMESTAMPTZ, _BYTEA = 23, 20, 25, 2950, 114, 1184, 17
_TXT, _BINARY = pq.Format.TEXT, pq.Format.BINARY
_FAILED, _SQLSTATE = pq.ExecStatus.FATAL_ERROR, pq.DiagnosticField.SQLSTATE
_POSTGRES_EPOCH_US = 946_684_800_000_000
"""Microseconds from the Unix epoch to 2000-01-01 UTC, where binary timestamps count from."""
_int8 = struct.Struct(">q").pack
_int4 = struct.Struct(">i").pack

_INSERT_ONE_NAME = b"fleetledger_append_one"
_INSERT_ONE = f"""
INSERT INTO events ({_COLUMNS})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""
# Numbers, the id, the timestamp and the hash go in binary: the server then parses none of them,
# which is worth about a twentieth of a lone append's round trip. Texts and bodies stay text.
_INSERT_ONE_TYPES = (_INT8, _TEXT, _INT8, _UUID, _TEXT, _INT4, _JSON, _JSON, _TIMESTAMPTZ, _BYTEA)
_INSERT_ONE_FORMATS = (_BINARY, _TXT, _BINARY, _BINARY, _TXT, _BINARY, _TXT, _TXT, _BINARY, _BINARY)

_INSERT_GROUP_NAME = b"fleetledger_append_group"
_INSERT_GROUP = f"""
INSERT INTO events ({_COLUMNS})
SELECT p, s, v, i, t, sv, d, m, at, decode(h, 'hex') FROM {_ROWS_FROM_JSON}
"""

_INSERT_OPENING_NAME = b"fleetledger_append_opening"
_INSERT_OPENING = f"""
WITH batch AS (
  SELECT * FROM {_ROWS_FROM_JSON}
), new_events AS (
  INSERT INTO events ({_COLUMNS})
  SELECT p, s, v, i, t, sv, d, m, at, decode(h, 'hex') FROM batch
), new_streams AS (
  INSERT INTO streams (stream_id, category, first_position)
  SELECT s, split_part(s, '-', 1), p FROM batch WHERE v = 1
  ON CONFLICT (stream_id) DO NOTHING
)
SELECT 1
"""

# The fenced statements differ only in their fence: the CTE ``fence`` yields one row, true,
# once every fence the rows need has passed, and the insert reads its rows through it.
_AFTER_FENCE = f"""), batch AS (
  SELECT * FROM {_ROWS_FROM_JSON}
), new_events AS (
  INSERT INTO events ({_COLUMNS})
  SELECT p, s, v, i, t, sv, d, m, at, decode(h, 'hex') FROM fence, batch WHERE fence.ok
), new_streams AS (
  INSERT INTO streams (stream_id, category, first_position)
  SELECT s, split_part(s, '-', 1), p FROM batch WHERE v = 1
  ON CONFLICT (stream_id) DO NOTHING
)
SELECT 1
"""

_INSERT_FENCED_NAME = b"fleetledger_append_fenced"
_INSERT_FENCED = f"""
WITH fence AS (
  SELECT fleetledger_fence($2::bigint, $3::bigint) AS ok
{_AFTER_FENCE}"""

_INSERT_SHARD_FENCED_NAME = b"fleetledger_append_shard_fenced"
_INSERT_SHARD_FENCED = f"""
WITH fence AS (
  SELECT fleetledger_fence_shards($2::text[], $3::bigint[], $4::bigint[]) AS ok
{_AFTER_FENCE}"""

# The log-wide fence first: reading through ``log_fence`` makes its call precede the shards'.
_INSERT_BOTH_FENCED_NAME = b"fleetledger_append_both_fenced"
_INSERT_BOTH_FENCED = f"""
WITH log_fence AS (
  SELECT fleetledger_fence($2::bigint, $3::bigint) AS ok
), fence AS (
  SELECT fleetledger_fence_shards($4::text[], $5::bigint[], $6::bigint[]) AS ok
    FROM log_fence WHERE log_fence.ok
{_AFTER_FENCE}"""

_VIEW_COLUMNS = """
SELECT head.global_position, head.hash, (SELECT term FROM fencing WHERE id = 1),
       (SELECT json_object_agg(sid, (SELECT stream_version FROM events
                                      WHERE stream_id = sid
                                      ORDER BY stream_version DESC LIMIT 1))
          FROM unnest(%s::text[]) AS sid),
       (SELECT json_agg(json_build_array(event_id, stream_id, stream_version, global_position))
          FROM events WHERE event_id = ANY(%s::uuid[]))"""
_VIEW_FROM = """
  FROM (SELECT 1) AS one
  LEFT JOIN LATERAL (SELECT global_position, hash FROM events
                      ORDER BY global_position DESC LIMIT 1) AS head ON true
"""
_VIEW = _VIEW_COLUMNS + _VIEW_FROM
# A group naming shards reads their recorded terms in the same snapshot.
_VIEW_WITH_SHARDS = (
    _VIEW_COLUMNS
    + """,
       (SELECT json_object_agg(shard, term) FROM shard_fencing WHERE shard = ANY(%s::text[]))"""
    + _VIEW_FROM
)


class PostgresAppender:
    """Commits groups of appends on its own autocommit connection; one instance per store."""

    def __init__(self, conninfo: str, *, on_commit: Callable[[], None]) -> None:
        self._conninfo = conninfo
        self._on_commit = on_commit
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
        # A stream the cached view has not seen is planned at version 0: a new stream (the
        # common case: every batch opens one) then costs no extra read, and if it did exist the
        # insert collides on (stream_id, stream_version) and the view is refreshed like any
        # other stale view. Likewise a shard it has not seen is planned at term 0: if the shard
        # has a higher term, the database's fence refuses the statement (``_FenceMoved``).
        view = self._view
        fresh = False
        for _ in range(MAX_ATTEMPTS):
            if view is None:
                view = self._refresh_view(items)
                fresh = True
            plan = plan_group(items, view, recorded_us=now_micros())
            if plan.has_rejections and not fresh:
                view = None
                continue
            if plan.rows:
                try:
                    self._insert(plan)
                except (pg_errors.UniqueViolation, _FenceMoved, pg_errors.DeadlockDetected):
                    # Nothing of the statement was written. A deadlock is possible only between
                    # transactions that mix fenced rows (see migration 0002) and is retried alike.
                    view = None
                    continue
            view.advance(plan)
            if plan.rows:
                self._on_commit()
            if len(view.versions) > MAX_CACHED_STREAMS:
                view.versions = {}
            self._view = view
            return list(plan.outcomes)
        raise StoreUnavailable(
            f"gave up after {MAX_ATTEMPTS} attempts: other processes keep appending at the same "
            "positions. Run one writing controller per database (see the leader election docs)"
        )

    def _connected(self) -> psycopg.Connection[Any]:
        # A connection that broke since is noticed by the statement that fails on it; the
        # failure closes it (see commit), so no liveness check is needed here.
        if self._connection is None:
            connection = psycopg.connect(self._conninfo, autocommit=True, client_encoding="utf8")
            try:
                for name, sql, types in _STATEMENTS:
                    check_result(connection.pgconn, connection.pgconn.prepare(name, sql, types))
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    def _refresh_view(self, items: Sequence[tuple[PreparedAppend, ...]]) -> LogView:
        """Read the head, the group's stream versions and its stored ids into the cached view
        (one query, one snapshot); other streams keep their cached versions."""
        stream_ids = sorted({a.stream_id for item in items for a in item})
        ids = [e.event_id for item in items for a in item for e in a.events]
        shards = sorted({a.shard for item in items for a in item if a.shard is not None})
        connection = self._connected()
        shard_terms = None
        if shards:
            query = connection.execute(_VIEW_WITH_SHARDS, (stream_ids, ids, shards), prepare=True)
            row = query.fetchone()
            assert row is not None
            position, digest, term, versions, stored, shard_terms = row
        else:
            row = connection.execute(_VIEW, (stream_ids, ids), prepare=True).fetchone()
            assert row is not None
            position, digest, term, versions, stored = row
        view = self._view if self._view is not None else LogView()
        view.head_position, view.head_hash = (
            (int(position), bytes(digest)) if position is not None else (0, GENESIS_HASH)
        )
        view.term = int(term or 0)
        for shard in shards:
            # A shard without a row is at term 0 (its first fenced append creates the row).
            view.shard_terms[shard] = int((shard_terms or {}).get(shard) or 0)
        for stream_id in stream_ids:
            found = (versions or {}).get(stream_id)
            view.versions[stream_id] = 0 if found is None else int(found)
        view.stored = {
            event_id: StoredEvent(stream_id, int(version), int(at))
            for event_id, stream_id, version, at in stored or ()
        }
        return view

    def _insert(self, plan: GroupPlan) -> None:
        rows = plan.rows
        pgconn = self._connected().pgconn
        if plan.first_term or plan.shards:
            result = pgconn.exec_prepared(*_fenced_insert(plan))
        elif len(rows) == 1 and rows[0].stream_version != 1:
            result = pgconn.exec_prepared(_INSERT_ONE_NAME, _one_row(rows[0]), _INSERT_ONE_FORMATS)
        else:
            opening = any(r.stream_version == 1 for r in rows)
            statement = _INSERT_OPENING_NAME if opening else _INSERT_GROUP_NAME
            result = pgconn.exec_prepared(statement, (_json_rows(rows),))
        if result.status == _FAILED and result.error_field(_SQLSTATE) == FENCED_SQLSTATE:
            raise _FenceMoved
        check_result(pgconn, result)


class _FenceMoved(Exception):
    """The fence refused a row's term: another process raised it since the view was read."""


def _fenced_insert(plan: GroupPlan) -> tuple[bytes, tuple[bytes, ...]]:
    """The statement and parameters inserting a plan whose rows carry terms."""
    rows = _json_rows(plan.rows)
    log_fence = (str(plan.first_term).encode(), str(plan.term).encode())
    if not plan.shards:
        return _INSERT_FENCED_NAME, (rows, *log_fence)
    # Sorted, so the function takes the rows' locks in this order without sorting them itself:
    # shard names are ASCII, where Python's order is the function's (COLLATE "C"). As array
    # literals they are quoted, and need no escaping: they are letters, digits and "._/-"
    # (checked when the append was prepared), none read as anything but its text ("NULL" too).
    shards = sorted(plan.shards.items())
    shard_fence = (
        ("{" + ",".join([f'"{shard}"' for shard, _ in shards]) + "}").encode(),
        ("{" + ",".join([str(span.first) for _, span in shards]) + "}").encode(),
        ("{" + ",".join([str(span.last) for _, span in shards]) + "}").encode(),
    )
    if not plan.first_term:
        return _INSERT_SHARD_FENCED_NAME, (rows, *shard_fence)
    return _INSERT_BOTH_FENCED_NAME, (rows, *log_fence, *shard_fence)


def _one_row(row: EventRow) -> tuple[bytes, ...]:
    event = row.event
    return (
        _int8(row.global_position),
        row.stream_id.encode(),
        _int8(row.stream_version),
        event.event_id_bytes,
        event.type.encode(),
        _int4(event.schema_version),
        event.data_text.encode(),
        event.metadata_text.encode(),
        _int8(row.recorded_us - _POSTGRES_EPOCH_US),
        row.hash,
    )


def _json_rows(rows: Sequence[EventRow]) -> bytes:
    recorded_at = from_epoch_micros(rows[0].recorded_us).isoformat()
    objects = ",".join(
        f'{{"p":{r.global_position},"s":{_json_string(r.stream_id)},"v":{r.stream_version},'
        f'"i":"{r.event.event_id}","t":{_json_string(r.event.type)},'
        f'"sv":{r.event.schema_version},"d":{r.event.data_text},"m":{r.event.metadata_text},'
        f'"at":"{recorded_at}","h":"{r.hash.hex()}"}}'
        for r in rows
    )
    return f"[{objects}]".encode()


_STATEMENTS: tuple[tuple[bytes, bytes, Sequence[int] | None], ...] = (
    (_INSERT_ONE_NAME, _INSERT_ONE.encode(), _INSERT_ONE_TYPES),
    (_INSERT_GROUP_NAME, _INSERT_GROUP.encode(), None),
    (_INSERT_OPENING_NAME, _INSERT_OPENING.encode(), None),
    (_INSERT_FENCED_NAME, _INSERT_FENCED.encode(), None),
    (_INSERT_SHARD_FENCED_NAME, _INSERT_SHARD_FENCED.encode(), None),
    (_INSERT_BOTH_FENCED_NAME, _INSERT_BOTH_FENCED.encode(), None),
)


@functools.lru_cache(maxsize=8192)
def _json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)
