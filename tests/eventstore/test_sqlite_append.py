"""The SQLite appender's rows: written as plain driver values, read back through the table's
column types as the values appended."""

from __future__ import annotations

import uuid
from datetime import UTC

import sqlalchemy as sa

from fleetledger.eventstore import NewEvent, open_store
from fleetledger.eventstore._schema import events, streams


def test_rows_read_back_through_the_column_types_as_appended(sqlite_url: str) -> None:
    """Id, time, hash and bodies come back through SQLAlchemy's types equal to the recorded
    event, in the forms those types write (32 hex digits, DATETIME text), and the new stream is
    registered under its category."""
    event_id = uuid.uuid4()
    with open_store(sqlite_url) as store:
        store.append(
            "node-a", [NewEvent("nodes.Joined", {"n": 1}, event_id=event_id)], expected_version=0
        )
        [recorded] = store.read_all()
        with store.engine.connect() as connection:
            typed = connection.execute(
                sa.select(events.c.event_id, events.c.recorded_at, events.c.hash, events.c.data)
            ).one()
            raw = connection.exec_driver_sql(
                "SELECT event_id, typeof(recorded_at), typeof(hash) FROM events"
            ).one()
            registered = connection.execute(sa.select(streams)).one()

    assert typed.event_id == event_id == recorded.event_id
    assert typed.recorded_at.replace(tzinfo=UTC) == recorded.recorded_at
    assert (bytes(typed.hash).hex(), typed.data) == (recorded.hash, '{"n":1}')
    assert tuple(raw) == (event_id.hex, "text", "blob")
    assert tuple(registered) == ("node-a", "node", recorded.global_position)


def test_a_retried_append_is_found_by_its_stored_ids(sqlite_url: str) -> None:
    """The stored ids are looked up as they are stored: a faithful retry gets its original
    result instead of a duplicate."""
    records = [NewEvent("nodes.Joined", {"n": n}, event_id=uuid.uuid4()) for n in range(3)]
    with open_store(sqlite_url) as store:
        first = store.append("node-b", records, expected_version=0)
        again = store.append("node-b", records, expected_version=0)
        assert again == first
        assert store.head() == 3
