"""The hash chain: verify accepts what either backend wrote and finds the first tampered event."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from fleetledger.eventstore import EventStore, InvalidEvent, NewEvent, VerifyReport
from tests.eventstore.support import bypassing_append_only_guard, new_events

TRIGGER = "fleetledger_events_append_only"


def fill(store: EventStore) -> None:
    """Seven events over three streams, with non-ASCII text, metadata and schema versions."""
    store.append("vm-1", new_events(2))
    store.append(
        "vm-ü",
        [
            NewEvent("Ünïcode", {"text": "日本語 🚀", "f": 1.25, "neg": -3}, {"actor": "zoë"}),
            NewEvent("Nested", {"a": {"b": [None, True, {"c": ""}]}}, schema_version=4),
        ],
    )
    store.append("vm-1", new_events(2, start=2))
    store.append("vm-2", [NewEvent("Escaped", {"q": 'quote " backslash \\ tab \t nl \n'})])


class TestVerify:
    def test_an_empty_log_verifies(self, store: EventStore) -> None:
        """verify on an empty log is ok with nothing checked."""
        assert store.verify() == VerifyReport(ok=True, checked=0, last_position=0)

    def test_a_fresh_log_verifies_completely(self, store: EventStore) -> None:
        """verify accepts every event the backend chained, checking all of them."""
        fill(store)

        report = store.verify()

        assert report == VerifyReport(ok=True, checked=7, last_position=7)
        assert report.checked == store.head()

    def test_verify_after_a_position(self, store: EventStore) -> None:
        """verify(after=k) checks only the events after k, chaining from k's stored hash."""
        fill(store)

        report = store.verify(after=4)

        assert report == VerifyReport(ok=True, checked=3, last_position=7)
        assert store.verify(after=7) == VerifyReport(ok=True, checked=0, last_position=7)

    def test_verify_after_a_missing_position_is_refused(self, store: EventStore) -> None:
        """verify(after=k) with no event at k is a caller error."""
        fill(store)

        with pytest.raises(InvalidEvent, match="no event at position 99"):
            store.verify(after=99)

    def test_progress_is_reported(self, store: EventStore) -> None:
        """verify calls progress(checked, last_position) as it goes."""
        fill(store)
        calls: list[tuple[int, int]] = []

        store.verify(progress=lambda checked, last: calls.append((checked, last)))

        assert calls[-1] == (7, 7)


def tamper(store: EventStore, statement: str) -> None:
    with store.engine.begin() as conn:
        conn.exec_driver_sql(statement)


def tamper_file(store: EventStore, statement: str) -> None:
    """Edit the SQLite log as whoever holds the file would: past its append-only triggers."""
    bypassing_append_only_guard(store.engine, statement)


class TestTamperingOnSqlite:
    def test_changed_data_is_found_at_its_position(self, sqlite_store: EventStore) -> None:
        """Rewriting one event's data makes verify fail at exactly that position."""
        fill(sqlite_store)

        tamper_file(
            sqlite_store, """UPDATE events SET data = '{"n":99}' WHERE global_position = 5"""
        )

        report = sqlite_store.verify()
        assert (report.ok, report.first_bad_position, report.checked) == (False, 5, 4)
        assert report.reason is not None

    def test_the_first_of_several_changes_is_reported(self, sqlite_store: EventStore) -> None:
        """With several tampered events verify reports the earliest one."""
        fill(sqlite_store)

        tamper_file(
            sqlite_store,
            """UPDATE events SET metadata = '{"actor":"eve"}' WHERE global_position = 6""",
        )
        tamper_file(sqlite_store, "UPDATE events SET type = 'Forged' WHERE global_position = 3")

        assert sqlite_store.verify().first_bad_position == 3

    def test_verify_after_skips_earlier_tampering(self, sqlite_store: EventStore) -> None:
        """verify(after=k) only judges events after k."""
        fill(sqlite_store)

        tamper_file(sqlite_store, "UPDATE events SET stream_version = 9 WHERE global_position = 2")

        assert sqlite_store.verify().first_bad_position == 2
        assert sqlite_store.verify(after=2).ok

    def test_a_deleted_event_is_found(self, sqlite_store: EventStore) -> None:
        """A hole in the positions fails verify at the missing position."""
        fill(sqlite_store)

        tamper_file(sqlite_store, "DELETE FROM events WHERE global_position = 4")

        report = sqlite_store.verify()
        assert (report.ok, report.first_bad_position, report.checked) == (False, 4, 3)

    def test_a_rewritten_hash_is_found(self, sqlite_store: EventStore) -> None:
        """Replacing a stored hash breaks the chain at that event."""
        fill(sqlite_store)

        tamper_file(sqlite_store, "UPDATE events SET hash = zeroblob(32) WHERE global_position = 7")

        assert sqlite_store.verify().first_bad_position == 7


class TestTamperingOnPostgres:
    @pytest.mark.parametrize(
        "statement",
        [
            """UPDATE events SET data = '{"n":99}' WHERE global_position = 5""",
            "DELETE FROM events WHERE global_position = 5",
            "TRUNCATE events",
        ],
    )
    def test_changes_to_events_are_refused(
        self, postgres_store: EventStore, statement: str
    ) -> None:
        """UPDATE, DELETE and TRUNCATE on events are refused by the append-only triggers."""
        fill(postgres_store)

        with pytest.raises(sa.exc.DBAPIError, match="append-only"):
            tamper(postgres_store, statement)

        assert postgres_store.head() == 7
        assert postgres_store.verify().ok

    def test_tampering_past_the_trigger_is_found(self, postgres_store: EventStore) -> None:
        """A superuser who disables the trigger and edits an event is caught by verify."""
        fill(postgres_store)

        tamper(
            postgres_store,
            f"ALTER TABLE events DISABLE TRIGGER {TRIGGER}; "
            """UPDATE events SET data = '{"text":"forged"}' WHERE global_position = 3; """
            f"ALTER TABLE events ENABLE TRIGGER {TRIGGER}",
        )

        report = postgres_store.verify()
        assert (report.ok, report.first_bad_position, report.checked) == (False, 3, 2)
        assert postgres_store.verify(after=3).ok

    def test_a_deleted_event_is_found(self, postgres_store: EventStore) -> None:
        """Deleting an event with the trigger disabled fails verify at the missing position."""
        fill(postgres_store)

        tamper(
            postgres_store,
            f"ALTER TABLE events DISABLE TRIGGER {TRIGGER}; "
            "DELETE FROM events WHERE global_position = 6; "
            f"ALTER TABLE events ENABLE TRIGGER {TRIGGER}",
        )

        assert postgres_store.verify().first_bad_position == 6
