"""SQLAlchemy Core view of the log's tables (created by the Alembic migrations in migrations/).

Bodies are declared as :class:`JsonText`: the store always reads and writes their canonical JSON
text itself, never through a JSON type's own serialiser.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

__all__ = [
    "SCHEMA_REVISION",
    "checkpoints",
    "events",
    "fencing",
    "metadata",
    "shard_fencing",
    "snapshots",
    "streams",
]

SCHEMA_REVISION = "0005"
"""The Alembic revision this code needs; a test keeps it equal to the migrations' head."""


class JsonText(sa.types.TypeDecorator[str]):
    """A JSON body handled as its text: cast to ``json`` on the way in, to text on the way out.

    The store owns the encoding (canonical JSON, which the hash chain covers), so the driver must
    neither re-serialise on write nor decode on read.
    """

    impl = sa.Text
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> Any:
        return sa.cast(bindvalue, sa.Text().with_variant(postgresql.JSON(), "postgresql"))

    def column_expression(self, column: Any) -> Any:
        return sa.cast(column, sa.Text)


metadata = sa.MetaData()

events = sa.Table(
    "events",
    metadata,
    sa.Column("global_position", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("stream_id", sa.String(200), nullable=False),
    sa.Column("stream_version", sa.BigInteger, nullable=False),
    sa.Column("event_id", sa.Uuid, nullable=False),
    sa.Column("type", sa.String(200), nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("data", JsonText(), nullable=False),
    sa.Column("metadata", JsonText(), nullable=False),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
)

streams = sa.Table(
    "streams",
    metadata,
    sa.Column("stream_id", sa.String(200), primary_key=True),
    sa.Column("category", sa.String(200), nullable=False),
    sa.Column("first_position", sa.BigInteger, nullable=False),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

snapshots = sa.Table(
    "snapshots",
    metadata,
    sa.Column("stream_id", sa.String(200), primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("state", JsonText(), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

fencing = sa.Table(
    "fencing",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("term", sa.BigInteger, nullable=False),
)
"""One row (id 1): the highest leader term an append has carried (see migration 0002)."""

shard_fencing = sa.Table(
    "shard_fencing",
    metadata,
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("term", sa.BigInteger, nullable=False),
)
"""One row per shard an append has named: the highest leader term it carried for that shard
(see migration 0005). A shard without a row is at term 0."""
