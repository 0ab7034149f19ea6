"""The event log: events, streams, checkpoints, snapshots; append function and guard on Postgres.

Revision ID: 0001
Revises:
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Postgres stores bodies as ``json`` (the text verbatim: the hash chain covers that exact text);
# SQLite as TEXT. Global positions are assigned under the append lock, not by a sequence.
_JSON_TEXT = sa.Text().with_variant(postgresql.JSON(), "postgresql")
_POSITION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# Why an advisory lock inside the function: global_position must equal commit order, or a reader
# tailing "position > checkpoint" can skip an event that commits later with a lower position.
# Taking one transaction-scoped lock before reading the head and holding it to commit serialises
# appenders; the in-process group commit is what recovers throughput. Everything happens in one
# statement, so an append is one round trip.
#
# Input is a group of items (one per caller), flattened into arrays so the function runs a fixed
# number of SQL statements whatever the group's size:
#   per stream append k:  p_item[k] (1-based item number, non-decreasing), p_slot[k] (index into
#                          p_slot_streams, the group's distinct streams), p_expected[k] (>= 0
#                          exact, -1 any, -2 exists), p_count[k] (its number of events);
#   per event, in order:  p_ids, p_types, p_schema_versions, p_data, p_metadata.
# Appends of one item come sorted by stream id, and no event id repeats within a group (the
# client splits such groups). Output: one JSON entry per item: {"ok": [[first, last, version],
# ...]} or {"err": "version", "s": stream, "a": actual} or {"err": "duplicate", "id": event_id}.
# Each item succeeds or fails on its own: group commit must not let one caller fail another.
_APPEND_FUNCTION = r"""
CREATE FUNCTION fleetledger_append(
  p_item int[], p_slot int[], p_expected bigint[], p_count int[], p_slot_streams text[],
  p_ids uuid[], p_types text[], p_schema_versions int[], p_data text[], p_metadata text[]
) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
  v_now timestamptz := now();
  v_now_us text := ((extract(epoch FROM now()) * 1000000)::bigint)::text;
  v_pos bigint;
  v_hash bytea;
  v_initial bigint[];
  v_version bigint[];
  v_existing uuid[];
  v_out jsonb := '[]'::jsonb;
  v_ok jsonb;
  v_err jsonb;
  v_appends int := coalesce(array_length(p_item, 1), 0);
  v_event_start int[] := array_fill(0, ARRAY[v_appends]);
  a int := 1;
  a_end int;
  k int;
  j int;
  v_cur bigint;
  v_exp bigint;
  v_stream text;
  v_first bigint;
  v_replay jsonb;
  v_matched int;
  v_max bigint;
  v_dup uuid;
  o_pos bigint[] := '{}';
  o_stream text[] := '{}';
  o_version bigint[] := '{}';
  o_event int[] := '{}';
  o_hash bytea[] := '{}';
BEGIN
  PERFORM pg_advisory_xact_lock(4242001);
  SELECT global_position, hash INTO v_pos, v_hash FROM events ORDER BY global_position DESC LIMIT 1;
  IF NOT FOUND THEN
    v_pos := 0;
    v_hash := decode(repeat('00', 32), 'hex');
  END IF;
  SELECT array_agg(coalesce(s.version, 0) ORDER BY u.o) INTO v_initial
    FROM unnest(p_slot_streams) WITH ORDINALITY AS u(sid, o)
    LEFT JOIN streams s ON s.stream_id = u.sid;
  v_version := v_initial;
  SELECT array_agg(event_id) INTO v_existing FROM events WHERE event_id = ANY(p_ids);

  j := 1;
  FOR k IN 1 .. v_appends LOOP
    v_event_start[k] := j;
    j := j + p_count[k];
  END LOOP;

  WHILE a <= v_appends LOOP
    a_end := a;
    WHILE a_end < v_appends AND p_item[a_end + 1] = p_item[a] LOOP
      a_end := a_end + 1;
    END LOOP;
    v_err := NULL;
    v_ok := '[]'::jsonb;

    IF v_existing IS NOT NULL
       AND p_ids[v_event_start[a] : v_event_start[a_end] + p_count[a_end] - 1] && v_existing THEN
      -- Some ids are stored already. A faithful retry (same ids, same order, contiguous in the
      -- same stream, at versions its expectation allowed) gets its original result; anything
      -- else is a conflict. Rare, so plain queries are fine here.
      FOR k IN a .. a_end LOOP
        v_stream := p_slot_streams[p_slot[k]];
        SELECT count(*), min(ev.global_position), max(ev.stream_version)
          INTO v_matched, v_first, v_max
          FROM generate_series(0, p_count[k] - 1) AS g(i)
          JOIN events ev ON ev.event_id = p_ids[v_event_start[k] + g.i]
         WHERE ev.stream_id = v_stream
           AND ev.stream_version = (SELECT e2.stream_version FROM events e2
                                     WHERE e2.event_id = p_ids[v_event_start[k]]) + g.i;
        IF v_matched <> p_count[k] OR (p_expected[k] >= 0 AND v_max - v_matched <> p_expected[k])
        THEN
          SELECT id INTO v_dup FROM unnest(p_ids[v_event_start[k] : v_event_start[k] + p_count[k] - 1])
                 WITH ORDINALITY AS t(id, o)
           WHERE id = ANY(v_existing) ORDER BY o LIMIT 1;
          IF v_dup IS NULL THEN
            -- This append is new but a sibling in the same item was a replay: not a retry.
            SELECT id INTO v_dup FROM unnest(p_ids[v_event_start[a] : v_event_start[a_end] + p_count[a_end] - 1])
                   WITH ORDINALITY AS t(id, o)
             WHERE id = ANY(v_existing) ORDER BY o LIMIT 1;
          END IF;
          v_err := jsonb_build_object('err', 'duplicate', 'id', v_dup::text);
          EXIT;
        END IF;
        v_ok := v_ok || jsonb_build_array(jsonb_build_array(v_first, v_first + v_matched - 1, v_max));
      END LOOP;
      v_out := v_out || jsonb_build_array(coalesce(v_err, jsonb_build_object('ok', v_ok)));
      a := a_end + 1;
      CONTINUE;
    END IF;

    FOR k IN a .. a_end LOOP
      v_cur := v_version[p_slot[k]];
      v_exp := p_expected[k];
      IF (v_exp >= 0 AND v_cur <> v_exp) OR (v_exp = -2 AND v_cur = 0) THEN
        v_err := jsonb_build_object('err', 'version', 's', p_slot_streams[p_slot[k]], 'a', v_cur);
        EXIT;
      END IF;
    END LOOP;
    IF v_err IS NOT NULL THEN
      v_out := v_out || jsonb_build_array(v_err);
      a := a_end + 1;
      CONTINUE;
    END IF;

    FOR k IN a .. a_end LOOP
      v_stream := p_slot_streams[p_slot[k]];
      v_cur := v_version[p_slot[k]];
      v_first := v_pos + 1;
      FOR j IN v_event_start[k] .. v_event_start[k] + p_count[k] - 1 LOOP
        v_pos := v_pos + 1;
        v_cur := v_cur + 1;
        v_hash := sha256(v_hash || convert_to(
            v_pos::text || E'\n' || v_stream || E'\n' || v_cur::text || E'\n' ||
            p_ids[j]::text || E'\n' || p_types[j] || E'\n' || p_schema_versions[j]::text || E'\n' ||
            v_now_us || E'\n' || p_data[j] || E'\n' || p_metadata[j], 'UTF8'));
        o_pos := o_pos || v_pos;
        o_stream := o_stream || v_stream;
        o_version := o_version || v_cur;
        o_event := o_event || j;
        o_hash := o_hash || v_hash;
      END LOOP;
      v_version[p_slot[k]] := v_cur;
      v_ok := v_ok || jsonb_build_array(jsonb_build_array(v_first, v_pos, v_cur));
    END LOOP;
    v_out := v_out || jsonb_build_array(jsonb_build_object('ok', v_ok));
    a := a_end + 1;
  END LOOP;

  IF array_length(o_pos, 1) > 0 THEN
    INSERT INTO events (global_position, stream_id, stream_version, event_id, type,
                        schema_version, data, metadata, recorded_at, hash)
    SELECT w.pos, w.stream, w.version, p_ids[w.ev], p_types[w.ev], p_schema_versions[w.ev],
           p_data[w.ev]::json, p_metadata[w.ev]::json, v_now, w.hash
      FROM unnest(o_pos, o_stream, o_version, o_event, o_hash) AS w(pos, stream, version, ev, hash);
    INSERT INTO streams (stream_id, version, category)
    SELECT u.sid, u.version, split_part(u.sid, '-', 1)
      FROM unnest(p_slot_streams, v_version, v_initial) AS u(sid, version, initial)
     WHERE u.version <> u.initial
    ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version;
    -- A wake-up hint only (delivered at commit); subscribers still poll as a fallback.
    PERFORM pg_notify('fleetledger_events', v_pos::text);
  END IF;
  RETURN v_out;
END
$fn$;
"""

_GUARD_FUNCTION = r"""
CREATE FUNCTION fleetledger_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION 'fleetledger events are append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END
$fn$;
"""


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("global_position", _POSITION, primary_key=True, autoincrement=False),
        sa.Column("stream_id", sa.String(200), nullable=False),
        sa.Column("stream_version", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.Uuid, nullable=False),
        sa.Column("type", sa.String(200), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("data", _JSON_TEXT, nullable=False),
        sa.Column("metadata", _JSON_TEXT, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.UniqueConstraint("stream_id", "stream_version", name="uq_events_stream_version"),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    op.create_index("ix_events_type_position", "events", ["type", "global_position"])
    op.create_table(
        "streams",
        sa.Column("stream_id", sa.String(200), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("category", sa.String(200), nullable=False),
    )
    op.create_index("ix_streams_category", "streams", ["category"])
    op.create_table(
        "checkpoints",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "snapshots",
        sa.Column("stream_id", sa.String(200), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("state", _JSON_TEXT, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_APPEND_FUNCTION)
        op.execute(_GUARD_FUNCTION)
        op.execute(
            "CREATE TRIGGER fleetledger_events_append_only BEFORE UPDATE OR DELETE ON events "
            "FOR EACH ROW EXECUTE FUNCTION fleetledger_refuse_change()"
        )
        op.execute(
            "CREATE TRIGGER fleetledger_events_no_truncate BEFORE TRUNCATE ON events "
            "FOR EACH STATEMENT EXECUTE FUNCTION fleetledger_refuse_change()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS fleetledger_events_no_truncate ON events")
        op.execute("DROP TRIGGER IF EXISTS fleetledger_events_append_only ON events")
        op.execute("DROP FUNCTION IF EXISTS fleetledger_refuse_change()")
        op.execute("DROP FUNCTION IF EXISTS fleetledger_append(int[], int[], bigint[], int[], text[], uuid[], text[], int[], text[], text[])")
    op.drop_table("snapshots")
    op.drop_table("checkpoints")
    op.drop_index("ix_streams_category", table_name="streams")
    op.drop_table("streams")
    op.drop_index("ix_events_type_position", table_name="events")
    op.drop_table("events")
