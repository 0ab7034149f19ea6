"""An append-only guard on SQLite: triggers refusing UPDATE and DELETE on ``events``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26

Postgres has had its guard since 0001 (row triggers on UPDATE and DELETE, a statement trigger on
TRUNCATE). SQLite has no TRUNCATE (``DELETE FROM events`` without a ``WHERE`` is still a DELETE,
and the triggers turn off the optimisation that would skip them), so two row triggers cover it.

Like Postgres's, this guard stops mistakes and code paths, not whoever holds the file: they can
drop the triggers. The hash chain and signed anchors (eventstore/anchors.py) are what detect that.

On SQLite, Alembic's batch mode alters a table by copying it into a new one and dropping the old,
which drops its triggers too: a later migration that batch-alters ``events`` must create these
again.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite's RAISE takes a literal message only, so each operation names itself.
_TRIGGERS = {
    "fleetledger_events_no_update": "UPDATE",
    "fleetledger_events_no_delete": "DELETE",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for name, operation in _TRIGGERS.items():
        op.execute(
            f"CREATE TRIGGER {name} BEFORE {operation} ON events "
            f"BEGIN SELECT RAISE(ABORT, 'fleetledger events are append-only: {operation} "
            "refused'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for name in _TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
