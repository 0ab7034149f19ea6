"""Fencing per shard: each shard's highest leader term, and on Postgres the function enforcing it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27

A shard's leader (docs/SCALING.md, "Leadership per shard") puts ``leader_shard`` beside
``leader_term`` in its events' metadata: such a term is fenced against that shard's own recorded
term, one row of ``shard_fencing``, exactly as 0002 fences a term without a shard against the one
row of ``fencing``. Terms of different shards, and the log-wide term, are independent: an
election in ``nodes/0`` neither refuses nor waits for appends of ``nodes/1``. A shard without a
row has recorded term 0; its row is created by the first append that names it.

On Postgres the appender's statement for rows naming shards calls
``fleetledger_fence_shards(shards, firsts, lasts)`` in the same statement as the insert
(eventstore/_postgres_append.py), with each shard's lowest and highest term among the rows.

Why a row lock, as in 0002: a stale-term append of a shard racing that shard's election must
either commit before it or be refused after it. Raising a shard's term updates its row, which
holds the write lock until the election commits; checking a term takes the row ``FOR SHARE``,
which waits for that commit and then reads the newest version (the function is ``VOLATILE``, so
each of its statements reads with a fresh snapshot under READ COMMITTED), and in turn holds off
an election until the checked append has committed.

Why a missing row is created with ``INSERT … ON CONFLICT DO NOTHING`` and then locked: before a
shard's row exists there is nothing to lock, and a stale append could slip past an election that
is inserting the row (neither sees the other's uncommitted row). The insert closes that gap: a
second transaction inserting the same key waits on the first one's index entry until it commits
(then does nothing) or aborts (then inserts), and only then updates or locks the row, which is
from then on the row every later append and election of the shard meet on. Rows already present
(the steady state) pay no insert: the UPDATE or the ``FOR SHARE`` read finds them first.

Why sorted order: one statement fences every shard its rows name, taking one row lock per shard
and holding them until it commits. Two statements locking the same shards in different orders
could each wait for the other; taking them in one total order (``COLLATE "C"``, so the order
does not depend on the database's collation) means a statement only ever waits for a shard
ranked after every shard it already holds, so no cycle can form. The function sorts the shards
itself, whatever order its caller passes. A statement carrying a log-wide term as well calls
``fleetledger_fence`` first, so the ``fencing`` row ranks before every shard row.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FENCED_SQLSTATE = "LT001"
"""The same refusal as ``fleetledger_fence``'s: the appender re-plans on a fresh view."""

# Per shard, the rule of ``fleetledger_fence`` (0002): raise first, as an UPDATE that takes the
# row's write lock at once (taking FOR SHARE first and upgrading would let two raisers
# deadlock); otherwise read the row FOR SHARE and refuse a first term below it. A missing row is
# inserted at term 0 and the shard judged again, now on a row that exists.
#
# The shards are visited by index, in sorted order. The appender passes them sorted already, which
# the loop over neighbours confirms with plain comparisons; only a caller passing them in another
# order pays for a query sorting them. (A query in the function, even a small one, cost about as
# much as the rest of the call: 10 against 5 microseconds per shard, timed inside the server.)
_FENCE_SHARDS_FUNCTION = rf"""
CREATE FUNCTION fleetledger_fence_shards(shards text[], firsts bigint[], lasts bigint[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  n integer := cardinality(shards);
  fence_shard text;
  fence_first bigint;
  fence_last bigint;
  latest bigint;
BEGIN
  IF n IS NULL OR n IS DISTINCT FROM cardinality(firsts)
     OR n IS DISTINCT FROM cardinality(lasts) THEN
    RAISE EXCEPTION 'fleetledger_fence_shards needs as many first and last terms as shards'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  FOR i IN 2..n LOOP
    CONTINUE WHEN shards[i - 1] COLLATE "C" < shards[i] COLLATE "C";
    SELECT array_agg(s ORDER BY s COLLATE "C"), array_agg(f ORDER BY s COLLATE "C"),
           array_agg(l ORDER BY s COLLATE "C")
      INTO shards, firsts, lasts
      FROM unnest(shards, firsts, lasts) AS wanted(s, f, l);
    EXIT;
  END LOOP;
  FOR i IN 1..n LOOP
    fence_shard := shards[i];
    fence_first := firsts[i];
    fence_last := lasts[i];
    IF fence_shard IS NULL OR fence_first IS NULL OR fence_last IS NULL THEN
      RAISE EXCEPTION 'fleetledger_fence_shards got a NULL shard or term'
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR attempt IN 1..2 LOOP
      UPDATE shard_fencing SET term = fence_last
       WHERE shard = fence_shard AND term < fence_last AND term <= fence_first;
      EXIT WHEN FOUND;
      SELECT term INTO latest FROM shard_fencing WHERE shard = fence_shard FOR SHARE;
      IF FOUND THEN
        IF fence_first < latest THEN
          RAISE EXCEPTION 'append from term % of shard % refused: term % is the latest elected',
            fence_first, fence_shard, latest
            USING ERRCODE = '{FENCED_SQLSTATE}',
                  HINT = 'this process no longer leads the shard: stop its side effects';
        END IF;
        EXIT;
      END IF;
      IF attempt = 2 THEN
        RAISE EXCEPTION 'shard_fencing row of % vanished while fencing it', fence_shard;
      END IF;
      INSERT INTO shard_fencing (shard, term) VALUES (fence_shard, 0)
        ON CONFLICT (shard) DO NOTHING;
    END LOOP;
  END LOOP;
  RETURN true;
END
$fn$;
"""

# A log written at 0004 after a downgrade from here may hold shard terms already: start each
# shard from its highest well-formed term, so a deposed shard leader is not let back in by the
# upgrade (as 0002 does for the log-wide term).
_HIGHEST_SHARD_TERMS = {
    "postgresql": """
        SELECT metadata ->> 'leader_shard', MAX((metadata ->> 'leader_term')::bigint) FROM events
         WHERE strpos(metadata::text, '"leader_shard"') > 0
           AND json_typeof(metadata -> 'leader_shard') = 'string'
           AND (metadata ->> 'leader_shard') ~ '^[A-Za-z0-9._/-]{1,200}$'
           AND json_typeof(metadata -> 'leader_term') = 'number'
           AND (metadata ->> 'leader_term') ~ '^[1-9][0-9]{0,17}$'
         GROUP BY 1
    """,
    "sqlite": """
        SELECT json_extract(metadata, '$.leader_shard'),
               MAX(json_extract(metadata, '$.leader_term')) FROM events
         WHERE instr(metadata, '"leader_shard"') > 0
           AND json_type(metadata, '$.leader_shard') = 'text'
           AND length(json_extract(metadata, '$.leader_shard')) BETWEEN 1 AND 200
           AND json_extract(metadata, '$.leader_shard') NOT GLOB '*[^A-Za-z0-9._/-]*'
           AND json_type(metadata, '$.leader_term') = 'integer'
           AND json_extract(metadata, '$.leader_term') > 0
         GROUP BY 1
    """,
}


def upgrade() -> None:
    shard_fencing = op.create_table(
        "shard_fencing",
        sa.Column("shard", sa.Text, primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.CheckConstraint("term >= 0", name="ck_shard_fencing_term"),
    )
    bind = op.get_bind()
    found = bind.exec_driver_sql(_HIGHEST_SHARD_TERMS[bind.dialect.name]).all()
    if found:
        op.bulk_insert(shard_fencing, [{"shard": str(s), "term": int(t)} for s, t in found])
    if bind.dialect.name == "postgresql":
        op.execute(_FENCE_SHARDS_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS fleetledger_fence_shards(text[], bigint[], bigint[])")
    op.drop_table("shard_fencing")
