"""The log is append-only in the database itself: a plain connection's UPDATE or DELETE on
``events`` is refused on both backends and changes nothing; only someone who takes the guard
down (and the hash chain then catches what they change) gets past it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from fleetledger.eventstore import EventStore
from tests.eventstore.support import bypassing_append_only_guard, new_events, raw_rows

REFUSED = [
    pytest.param("""UPDATE events SET data = '{"n":99}' WHERE global_position = 2""", id="update"),
    pytest.param("UPDATE events SET type = 'Forged'", id="update-all"),
    pytest.param("DELETE FROM events WHERE global_position = 3", id="delete"),
    pytest.param("DELETE FROM events", id="delete-all"),
]


def plain_connection(store: EventStore) -> sa.Engine:
    """An engine of its own on the store's database: no store code between the SQL and it."""
    return sa.create_engine(store.engine.url)


class TestAppendOnly:
    @pytest.mark.parametrize("statement", REFUSED)
    def test_a_change_to_events_is_refused_and_changes_nothing(
        self, store: EventStore, statement: str
    ) -> None:
        """UPDATE and DELETE on events fail with an error saying the log is append-only; every
        row is as it was and the chain still verifies."""
        store.append("vm-1", new_events(4))
        before = raw_rows(store)
        engine = plain_connection(store)

        try:
            with (
                pytest.raises(sa.exc.DBAPIError, match="append-only"),
                engine.begin() as conn,
            ):
                conn.exec_driver_sql(statement)
        finally:
            engine.dispose()

        assert raw_rows(store) == before
        assert store.verify().ok

    def test_appends_still_work_beside_the_guard(self, store: EventStore) -> None:
        """The guard refuses changes, not inserts: the store keeps appending and verifying."""
        store.append("vm-1", new_events(2))
        store.append("vm-1", new_events(2, start=2), expected_version=2)

        assert (store.head(), store.verify().ok) == (4, True)

    def test_past_the_guard_a_change_is_caught_by_verify(self, store: EventStore) -> None:
        """Whoever owns the database can take the guard down; the chain then finds the edit."""
        store.append("vm-1", new_events(4))

        bypassing_append_only_guard(
            store.engine, """UPDATE events SET data = '{"n":99}' WHERE global_position = 2"""
        )

        report = store.verify()
        assert (report.ok, report.first_bad_position) == (False, 2)
