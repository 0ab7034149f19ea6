"""The event log: events, streams, checkpoints, snapshots; an append-only guard on Postgres.

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
# SQLite as TEXT. Global positions are assigned by the appender (head + 1), not by a sequence:
# their unique index is what makes global order equal commit order (eventstore/_postgres_append.py).
_JSON_TEXT = sa.Text().with_variant(postgresql.JSON(), "postgresql")
_POSITION = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

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
    # A registry of streams, written once when a stream's first event is appended. The current
    # version is not kept here: it is the top of the (stream_id, stream_version) index, and
    # updating a row on every append cost a fifth of single-append throughput.
    op.create_table(
        "streams",
        sa.Column("stream_id", sa.String(200), primary_key=True),
        sa.Column("category", sa.String(200), nullable=False),
        sa.Column("first_position", sa.BigInteger, nullable=False),
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
    op.drop_table("snapshots")
    op.drop_table("checkpoints")
    op.drop_index("ix_streams_category", table_name="streams")
    op.drop_table("streams")
    op.drop_table("events")
