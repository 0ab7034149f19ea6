"""Unreachable, unmigrated and broken databases surface as StoreUnavailable / SchemaOutOfDate."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from fleetledger.eventstore import (
    EventStore,
    SchemaOutOfDate,
    StoreUnavailable,
    open_store,
)
from tests.eventstore.support import (
    admin_engine,
    events_with_ids,
    fresh_ids,
    postgres_database,
    raw_rows,
)


def terminate_other_sessions(url: str) -> int:
    """Kill every other session on the database at ``url`` (the store's), as a failover would."""
    admin = admin_engine(url)
    try:
        with admin.connect() as conn:
            return len(
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).all()
            )
    finally:
        admin.dispose()


class TestConnectionLoss:
    def test_append_after_the_connections_die_is_retriable(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """After the server kills the store's sessions an append raises StoreUnavailable or
        succeeds; retrying the same ids then succeeds, and the events are stored once."""
        postgres_store.append("vm-0", events_with_ids(*fresh_ids(1)))
        postgres_store.read_all()
        assert terminate_other_sessions(postgres_url) >= 1
        ids = fresh_ids(2)

        try:
            first = postgres_store.append("vm-1", events_with_ids(*ids), expected_version=0)
        except StoreUnavailable as e:
            assert "retry" in str(e)
            first = None
        retried = postgres_store.append("vm-1", events_with_ids(*ids), expected_version=0)

        assert first is None or first == retried
        assert [r["event_id"] for r in raw_rows(postgres_store)][1:] == ids
        assert postgres_store.stream_version("vm-1") == 2
        assert postgres_store.verify().ok

    def test_reads_recover_after_the_connections_die(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """Pooled read connections killed by the server are replaced transparently."""
        postgres_store.append("vm-1", events_with_ids(*fresh_ids(2)))
        postgres_store.read_all()
        postgres_store.read_stream("vm-1")

        terminate_other_sessions(postgres_url)

        assert len(postgres_store.read_all()) == 2
        assert len(postgres_store.read_stream("vm-1")) == 2
        assert postgres_store.head() == 2

    def test_a_live_subscription_survives_the_connections_dying(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """A following subscription whose LISTEN and pooled sessions are killed reconnects and
        still delivers every event once."""
        seen: list[int] = []
        postgres_store.append("vm-1", events_with_ids(*fresh_ids(1)))
        subscription = postgres_store.subscribe(
            "follower", lambda event, _conn: seen.append(event.global_position), poll_interval=0.2
        )
        with subscription:
            assert subscription.wait_for(1, timeout=20)

            terminate_other_sessions(postgres_url)
            for _ in range(3):
                # The first append may find its own session dead; the next one reconnects.
                with contextlib.suppress(StoreUnavailable):
                    postgres_store.append("vm-1", events_with_ids(*fresh_ids(1)))

            assert subscription.wait_for(postgres_store.head(), timeout=20)
        assert seen == list(range(1, postgres_store.head() + 1))
        assert postgres_store.head() >= 3


@pytest.fixture
def unmigrated_postgres(eventstore_postgres_server: str) -> Iterator[str]:
    """An empty Postgres database (no fleetledger tables)."""
    with postgres_database(eventstore_postgres_server) as url:
        yield url


class TestOpenStore:
    def test_an_unreachable_server(self) -> None:
        """open_store on a port nobody listens on raises StoreUnavailable quickly."""
        started = time.monotonic()

        with pytest.raises(StoreUnavailable, match="reachable"):
            open_store("postgresql+psycopg://postgres@127.0.0.1:1/fleetledger")

        assert time.monotonic() - started < 10

    def test_an_unmigrated_postgres_database(self, unmigrated_postgres: str) -> None:
        """open_store on an empty Postgres database names the upgrade command to run."""
        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(unmigrated_postgres)

    def test_an_unmigrated_sqlite_file(self, tmp_path: Path) -> None:
        """open_store on an empty SQLite file names the upgrade command to run."""
        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(f"sqlite:///{tmp_path / 'empty.db'}")

    def test_a_database_at_another_revision(self, store_url: str) -> None:
        """A database whose recorded revision is not this code's is refused, naming both."""
        engine = sa.create_engine(store_url)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
        engine.dispose()

        with pytest.raises(SchemaOutOfDate, match="at revision 9999") as raised:
            open_store(store_url)
        assert "fleetledger db upgrade" in str(raised.value)

    def test_the_message_hides_the_password(self) -> None:
        """A password in the URL does not appear in the error."""
        with pytest.raises(StoreUnavailable) as raised:
            open_store("postgresql+psycopg://postgres:s3cret@127.0.0.1:1/fleetledger")

        assert "s3cret" not in str(raised.value)
