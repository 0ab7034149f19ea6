"""Helpers shared by the event store tests: event factories, raw rows, throwaway databases."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
import sqlalchemy as sa

from fleetledger.eventstore import EventStore, NewEvent, scratch


def new_events(count: int, *, type: str = "Tested", start: int = 0) -> list[NewEvent]:
    """``count`` events of ``type`` with data ``{"n": start}``, ``{"n": start + 1}``, …"""
    return [NewEvent(type, {"n": start + n}) for n in range(count)]


def events_with_ids(*ids: uuid.UUID) -> list[NewEvent]:
    """One event per id, for idempotency tests that re-send the same ids."""
    return [NewEvent("Tested", {"id": str(i)}, event_id=i) for i in ids]


def fresh_ids(count: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(count)]


def raw_rows(store: EventStore) -> list[dict[str, Any]]:
    """Every stored event row as the database holds it, bypassing the store (and upcasters)."""
    query = sa.text(
        "SELECT global_position, stream_id, stream_version, event_id, type, schema_version, "
        "CAST(data AS TEXT) AS data, CAST(metadata AS TEXT) AS metadata "
        "FROM events ORDER BY global_position"
    )
    with store.engine.connect() as conn:
        rows = [dict(row._mapping) for row in conn.execute(query)]
    for row in rows:
        # SQLite keeps UUIDs as 32 hex digits; compare them as UUIDs on every backend.
        row["event_id"] = uuid.UUID(str(row["event_id"]))
    return rows


def bypassing_append_only_guard(engine: sa.Engine, *statements: str) -> None:
    """Run ``statements`` against ``events`` in one transaction, as someone who owns the database
    and slips past its append-only triggers: on Postgres a superuser who turns triggers off for
    the transaction; on SQLite whoever holds the file, who drops the triggers and puts them back
    afterwards so that nothing looks amiss."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            for statement in statements:
                conn.exec_driver_sql(statement)
            return
        triggers = conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'"
        ).all()
        for name, _ in triggers:
            conn.exec_driver_sql(f'DROP TRIGGER "{name}"')
        for statement in statements:
            conn.exec_driver_sql(statement)
        for _, sql in triggers:
            conn.exec_driver_sql(sql)


# The tests use the same throwaway databases the plugin and the bench use.
admin_engine = scratch.admin_engine
postgres_database = scratch.scratch_postgres_database


FreshDatabase = Callable[[], AbstractContextManager[str]]
"""Makes a context manager that yields the URL of a fresh database at the schema's head."""


def fresh_database(request: pytest.FixtureRequest, backend: str) -> FreshDatabase:
    """The fresh-database factory of ``backend`` (fixtures ``fresh_sqlite``/``fresh_postgres``
    in conftest.py), for fixtures that outlive one test or need many databases."""
    factory: FreshDatabase = request.getfixturevalue(f"fresh_{backend}")
    return factory
