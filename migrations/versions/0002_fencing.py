"""Fencing: the highest leader term recorded, and on Postgres the function that enforces it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26

An event whose metadata carries ``leader_term`` is refused when that term is below the highest one
recorded in ``fencing``; a higher term becomes the recorded one. The store's planner judges this
(on SQLite, inside its ``BEGIN IMMEDIATE`` write transaction, that judgement is the enforcement).
On Postgres several processes plan on views that may be stale, so the database enforces it: the
appender's statement for rows that carry terms calls ``fleetledger_fence(first, last)`` in the
same statement as the insert (eventstore/_postgres_append.py).

Why a row lock: a stale-term append racing an election must either commit before it or be refused
after it. Raising the term updates the ``fencing`` row, which holds its write lock until the
election commits; checking a term takes the row ``FOR SHARE``, which waits for that commit and
then reads the row's newest version (READ COMMITTED re-reads a locked row), and in turn holds
off an election until the checked append has committed. Either way the two are ordered.

Why not a trigger on ``events``: even one whose ``WHEN`` clause skips rows without a term slowed
every append without one by 4–6% (paired rounds of ``bench store``'s single and 8-writer
appends, the trigger enabled and disabled in turn): the executor prepares the trigger's ``WHEN``
expression again for every statement. Appends without a term run exactly the statements they ran
before this revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FENCED_SQLSTATE = "LT001"
"""Raised by the function; eventstore/_postgres_append.py re-plans on a fresh view when it sees
it. (Class LT is outside the classes SQL and Postgres define.)"""

# ``first`` and ``last`` are the lowest and highest terms the statement's rows carry; the planner
# keeps terms from decreasing along the rows, so this is the row-by-row rule "no row below the
# recorded term; the highest becomes it". Raising goes first, as an UPDATE that takes the row's
# write lock at once: taking FOR SHARE first and upgrading would let two raisers deadlock. An
# UPDATE whose condition is false on the row it sees takes no lock, so the steady state (the
# leader appending at the recorded term) pays a no-op UPDATE and a share lock.
_FENCE_FUNCTION = rf"""
CREATE FUNCTION fleetledger_fence(first bigint, last bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  latest bigint;
BEGIN
  UPDATE fencing SET term = last WHERE id = 1 AND term < last AND term <= first;
  IF FOUND THEN
    RETURN true;
  END IF;
  SELECT term INTO latest FROM fencing WHERE id = 1 FOR SHARE;
  IF first < latest THEN
    RAISE EXCEPTION 'append from leader term % refused: term % is the latest elected',
      first, latest
      USING ERRCODE = '{FENCED_SQLSTATE}',
            HINT = 'this process is no longer the leader: stop side effects and follow';
  END IF;
  RETURN true;
END
$fn$;
"""

# A log written before this revision may already hold terms (nothing refused them then): start
# from the highest well-formed one, so a deposed writer is not let back in by the upgrade.
_HIGHEST_TERM = {
    "postgresql": """
        SELECT COALESCE(MAX((metadata ->> 'leader_term')::bigint), 0) FROM events
         WHERE strpos(metadata::text, '"leader_term"') > 0
           AND json_typeof(metadata -> 'leader_term') = 'number'
           AND (metadata ->> 'leader_term') ~ '^[1-9][0-9]{0,17}$'
    """,
    "sqlite": """
        SELECT COALESCE(MAX(json_extract(metadata, '$.leader_term')), 0) FROM events
         WHERE instr(metadata, '"leader_term"') > 0
           AND json_type(metadata, '$.leader_term') = 'integer'
           AND json_extract(metadata, '$.leader_term') > 0
    """,
}


def upgrade() -> None:
    fencing = op.create_table(
        "fencing",
        sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.CheckConstraint("id = 1", name="ck_fencing_one_row"),
        sa.CheckConstraint("term >= 0", name="ck_fencing_term"),
    )
    bind = op.get_bind()
    term = bind.exec_driver_sql(_HIGHEST_TERM[bind.dialect.name]).scalar() or 0
    op.bulk_insert(fencing, [{"id": 1, "term": int(term)}])
    if bind.dialect.name == "postgresql":
        op.execute(_FENCE_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS fleetledger_fence(bigint, bigint)")
    op.drop_table("fencing")
