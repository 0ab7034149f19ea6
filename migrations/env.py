"""Alembic environment for fleetledger: one set of migrations for Postgres and SQLite.

Two ``db upgrade`` runs at once are safe: on Postgres the run holds a session advisory lock for its
whole duration; on SQLite it runs in one ``BEGIN IMMEDIATE`` transaction. Either way the second run
waits, then finds the schema at head and does nothing.
"""

from __future__ import annotations

from alembic import context

from fleetledger.eventstore._engine import SQLITE_IMMEDIATE, make_engine

MIGRATION_LOCK_KEY = 4_242_000

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    # No statement timeout: an index built over a long log, or waiting on another upgrade's
    # advisory lock, may rightly take longer than any request-path limit.
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "", statement_timeout=None)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
                conn.commit()
                try:
                    _run(conn)
                finally:
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
                    conn.commit()
            else:
                _run(conn.execution_options(**SQLITE_IMMEDIATE))
    finally:
        engine.dispose()


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=None,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        # Alembic assumes SQLite's DDL is not transactional and then commits after every
        # revision, which lets a second concurrent run read a revision that is stale by the time
        # it acts. SQLite's DDL is transactional; one transaction keeps the whole run atomic.
        transactional_ddl=True,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit(
        "offline (SQL script) migrations are not supported; run `fleetledger db upgrade`"
    )
run_migrations_online()
