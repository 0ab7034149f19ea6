"""Schema migrations: up from empty, down to base, up again, concurrently, on both backends."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from fleetledger.eventstore import Fenced, NewEvent, SchemaOutOfDate, migrate, open_store
from fleetledger.eventstore._schema import SCHEMA_REVISION, events, shard_fencing
from fleetledger.eventstore.migrate import DowngradeRefused, MigrationFailed
from tests.eventstore.support import new_events, postgres_database

ROOT = Path(__file__).resolve().parent.parent
TABLES = {"events", "streams", "checkpoints", "snapshots", "fencing", "shard_fencing"}


@pytest.fixture
def empty_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of the current backend: no tables at all."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server: str = request.getfixturevalue("eventstore_postgres_server")
    with postgres_database(server) as url:
        yield url


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def functions(url: str) -> set[str]:
    """fleetledger's Postgres functions present in the database."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT proname FROM pg_proc WHERE proname LIKE 'fleetledger%%'"
            )
            return {r[0] for r in rows}
    finally:
        engine.dispose()


def guard_refuses_update(url: str) -> bool:
    """Whether the database refuses an UPDATE on events (the append-only triggers are in
    place). The log must hold an event (row triggers fire on rows); without the triggers the
    UPDATE goes through: call it last, on a log you are done with."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE events SET type = 'x'")
        return False
    except sa.exc.DBAPIError as e:
        return "append-only" in str(e)
    finally:
        engine.dispose()


class TestRevision:
    def test_the_code_needs_the_head_revision(self) -> None:
        """The revision open_store requires is the newest migration."""
        assert migrate.head_revision() == SCHEMA_REVISION


class TestUpgradeAndDowngrade:
    def test_upgrade_from_empty(self, empty_url: str) -> None:
        """upgrade creates every table and records the head revision; the store opens."""
        assert migrate.current_revision(empty_url) is None

        migrate.upgrade(empty_url)

        assert tables(empty_url) >= TABLES
        assert migrate.current_revision(empty_url) == migrate.head_revision()
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(2))
            assert store.verify().ok
        assert guard_refuses_update(empty_url)

    def test_upgrade_twice_is_a_no_op(self, empty_url: str) -> None:
        """A second upgrade at head changes nothing and keeps the data."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(2))

        migrate.upgrade(empty_url)

        with open_store(empty_url) as store:
            assert store.head() == 2

    def test_downgrade_to_base_drops_everything(self, empty_url: str, backend: str) -> None:
        """downgrade to base removes the tables (and on Postgres the functions)."""
        migrate.upgrade(empty_url)

        migrate.downgrade(empty_url, "base")

        assert not TABLES & tables(empty_url)
        assert migrate.current_revision(empty_url) is None
        if backend == "postgres":
            assert not functions(empty_url)

    def test_upgrade_again_after_downgrade(self, empty_url: str) -> None:
        """After a downgrade to base, upgrade brings back a working, empty log."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(3))
        migrate.downgrade(empty_url, "base", drop_events=True)

        migrate.upgrade(empty_url)

        assert tables(empty_url) >= TABLES
        with open_store(empty_url) as store:
            assert store.head() == 0
            store.append("vm-1", new_events(1), expected_version=0)
            assert store.verify().ok
        assert guard_refuses_update(empty_url)

    def test_open_store_refuses_a_database_at_base(self, empty_url: str) -> None:
        """A database downgraded to base is refused with SchemaOutOfDate naming the fix."""
        migrate.upgrade(empty_url)
        migrate.downgrade(empty_url, "base")

        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(empty_url)


class TestDestructiveDowngrades:
    def test_base_is_refused_on_a_log_holding_events(self, empty_url: str) -> None:
        """Dropping a non-empty log needs drop_events=True; without it nothing changes."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(2))

        with pytest.raises(DowngradeRefused, match="holds 2 events"):
            migrate.downgrade(empty_url, "base")

        assert migrate.current_revision(empty_url) == migrate.head_revision()
        assert migrate.count_events(empty_url) == 2

    def test_count_events_is_zero_before_any_table(self, empty_url: str) -> None:
        """An unmigrated database holds no events (and counting does not fail)."""
        assert migrate.count_events(empty_url) == 0

    @pytest.mark.parametrize(
        ("revision", "refusal", "reason"),
        [
            ("-3", MigrationFailed, "give a revision id"),
            ("0003-3", MigrationFailed, "give a revision id"),
            ("0001@base", DowngradeRefused, "holds 2 events"),
        ],
    )
    def test_other_spellings_of_base_cannot_drop_events_unconfirmed(
        self, empty_url: str, revision: str, refusal: type[Exception], reason: str
    ) -> None:
        """A relative revision is refused (judging it would need the current one); a branch
        spelling of base is judged as base. Either way the log is left as it was."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(2))

        with pytest.raises(refusal, match=reason):
            migrate.downgrade(empty_url, revision)

        assert migrate.current_revision(empty_url) == migrate.head_revision()
        assert migrate.count_events(empty_url) == 2

    def test_an_unknown_revision_is_a_migration_error(self, empty_url: str) -> None:
        """Alembic's refusal comes out as MigrationFailed naming the revision."""
        with pytest.raises(MigrationFailed, match="'nosuch'"):
            migrate.upgrade(empty_url, "nosuch")
        migrate.upgrade(empty_url)
        with pytest.raises(MigrationFailed, match="'nosuch'"):
            migrate.downgrade(empty_url, "nosuch")


class TestConcurrentUpgrades:
    def test_two_upgrades_at_once_both_succeed(self, empty_url: str) -> None:
        """Two processes upgrading the same empty database at once both exit cleanly and
        leave it at head."""
        script = f"from eventstore import migrate; migrate.upgrade({empty_url!r})"
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", script],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]

        outputs = [p.communicate(timeout=120) for p in processes]

        for process, (_, stderr) in zip(processes, outputs, strict=True):
            assert process.returncode == 0, stderr
        assert migrate.current_revision(empty_url) == migrate.head_revision()
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(1))
            assert store.verify().ok


def fenced(term: int) -> list[NewEvent]:
    return [NewEvent("Tested", {}, metadata={"leader_term": term})]


def insert_unchecked_event(
    url: str, position: int, *, metadata: str = '{"leader_term":"99"}', stream: str = "old-1"
) -> None:
    """A row written behind the store's back, as before revision 0002 (or 0005), whose
    ``leader_term`` (or ``leader_shard``) nothing validated then."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                events.insert().values(
                    global_position=position,
                    stream_id=stream,
                    stream_version=1,
                    event_id=uuid.uuid4(),
                    type="Tested",
                    schema_version=1,
                    data="{}",
                    metadata=metadata,
                    recorded_at=datetime.now(UTC),
                    hash=bytes(32),
                )
            )
    finally:
        engine.dispose()


class TestFencingRevision:
    def test_downgrade_to_0001_removes_the_fence(self, empty_url: str, backend: str) -> None:
        """Going back to 0001 drops the fencing table (and on Postgres its trigger and
        function) and keeps the events; the store then asks for an upgrade."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", fenced(3))

        migrate.downgrade(empty_url, "0001")

        assert "fencing" not in tables(empty_url)
        assert "events" in tables(empty_url)
        if backend == "postgres":
            assert functions(empty_url) == {"fleetledger_refuse_change"}
        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(empty_url)
        assert guard_refuses_update(empty_url) == (backend == "postgres")

    def test_upgrade_starts_the_fence_at_the_highest_term_already_logged(
        self, empty_url: str
    ) -> None:
        """A log that gathered terms before 0002 keeps its deposed writers out after the
        upgrade; a malformed old value is ignored rather than failing the upgrade."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", fenced(3))
            store.append("vm-1", fenced(7))
        migrate.downgrade(empty_url, "0001")
        insert_unchecked_event(empty_url, position=3)

        migrate.upgrade(empty_url)

        with open_store(empty_url) as store:
            assert store.leader_term() == 7
            with pytest.raises(Fenced):
                store.append("vm-1", fenced(6))
            store.append("vm-1", fenced(7))


def sqlite_triggers(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'"
            )
            return {r[0] for r in rows}
    finally:
        engine.dispose()


class TestAppendOnlyRevision:
    def test_upgrade_guards_sqlite_like_postgres(self, empty_url: str, backend: str) -> None:
        """At 0003 both backends refuse UPDATE on events; SQLite through its own triggers."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(1))  # row triggers fire only on rows

        assert guard_refuses_update(empty_url)
        if backend == "sqlite":
            assert sqlite_triggers(empty_url) == {
                "fleetledger_events_no_update",
                "fleetledger_events_no_delete",
            }

    def test_downgrade_to_0002_lifts_only_the_sqlite_guard(
        self, empty_url: str, backend: str
    ) -> None:
        """Going back to 0002 drops SQLite's triggers and nothing else: the events stay, no
        confirmation is needed, Postgres keeps the guard it has had since 0001, and the store
        asks for an upgrade."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(2))

        migrate.downgrade(empty_url, "0002")

        assert migrate.current_revision(empty_url) == "0002"
        assert migrate.count_events(empty_url) == 2
        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(empty_url)
        assert guard_refuses_update(empty_url) == (backend == "postgres")

    def test_upgrade_from_0002_guards_a_log_already_holding_events(self, empty_url: str) -> None:
        """The triggers go onto an existing log: its events stay, verify, and are guarded."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(3))
        migrate.downgrade(empty_url, "0002")

        migrate.upgrade(empty_url)

        with open_store(empty_url) as store:
            assert (store.head(), store.verify().ok) == (3, True)
        assert guard_refuses_update(empty_url)


def event_indexes(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {index["name"] or "" for index in sa.inspect(conn).get_indexes("events")}
    finally:
        engine.dispose()


class TestEventsByTypeRevision:
    def test_upgrade_indexes_events_by_type_and_position(self, empty_url: str) -> None:
        migrate.upgrade(empty_url)

        assert "ix_events_type_position" in event_indexes(empty_url)

    def test_downgrade_to_0003_drops_only_the_index(self, empty_url: str) -> None:
        """The events stay and the store asks for an upgrade; upgrading again restores it."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("vm-1", new_events(2))

        migrate.downgrade(empty_url, "0003")

        assert "ix_events_type_position" not in event_indexes(empty_url)
        assert migrate.count_events(empty_url) == 2
        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(empty_url)
        migrate.upgrade(empty_url)
        assert "ix_events_type_position" in event_indexes(empty_url)


def sharded(shard: str, term: int) -> list[NewEvent]:
    return [NewEvent("Tested", {}, metadata={"leader_term": term, "leader_shard": shard})]


def shard_rows(url: str) -> dict[str, int]:
    """Every row of ``shard_fencing``: shard -> recorded term."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = sa.select(shard_fencing.c.shard, shard_fencing.c.term)
            return {str(shard): int(term) for shard, term in conn.execute(query)}
    finally:
        engine.dispose()


class TestShardFencingRevision:
    def test_downgrade_to_0004_removes_only_the_shard_fence(
        self, empty_url: str, backend: str
    ) -> None:
        """Going back to 0004 drops shard_fencing (and on Postgres its function) and keeps the
        events and the log-wide fence; the store then asks for an upgrade."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("node-a", sharded("nodes/0", 3))
            store.append("vm-1", fenced(2))

        migrate.downgrade(empty_url, "0004")

        assert "shard_fencing" not in tables(empty_url)
        assert {"events", "fencing"} <= tables(empty_url)
        assert migrate.count_events(empty_url) == 2
        if backend == "postgres":
            assert functions(empty_url) == {"fleetledger_refuse_change", "fleetledger_fence"}
        with pytest.raises(SchemaOutOfDate, match="fleetledger db upgrade"):
            open_store(empty_url)

    def test_upgrade_creates_an_empty_shard_fence_on_a_log_without_shards(
        self, empty_url: str
    ) -> None:
        """Terms without a shard stay log-wide: the upgrade records no shard for them."""
        migrate.upgrade(empty_url, "0004")
        assert "shard_fencing" not in tables(empty_url)
        insert_unchecked_event(empty_url, position=1, metadata='{"leader_term":4}')

        migrate.upgrade(empty_url)

        assert shard_rows(empty_url) == {}
        with open_store(empty_url) as store:
            store.append("node-a", sharded("nodes/0", 1))
            assert store.leader_term("nodes/0") == 1

    def test_upgrade_starts_each_shard_at_its_highest_term_already_logged(
        self, empty_url: str
    ) -> None:
        """A log that gathered shard terms at 0004 (after a downgrade) keeps each shard's
        deposed writers out after the upgrade; malformed old values are ignored rather than
        failing the upgrade or making up a shard."""
        migrate.upgrade(empty_url)
        with open_store(empty_url) as store:
            store.append("node-a", sharded("nodes/0", 3))
            store.append("node-a", sharded("nodes/0", 7))
            store.append("node-b", sharded("nodes/1", 2))
            store.append("vm-1", fenced(5))
        migrate.downgrade(empty_url, "0004")
        for position, metadata in enumerate(
            [
                '{"leader_shard":"nodes 0","leader_term":9}',
                '{"leader_shard":"nodes/0","leader_term":"99"}',
                '{"leader_shard":7,"leader_term":9}',
                '{"leader_shard":"nodes/2"}',
            ],
            start=5,
        ):
            insert_unchecked_event(empty_url, position, metadata=metadata, stream=f"old-{position}")

        migrate.upgrade(empty_url)

        assert shard_rows(empty_url) == {"nodes/0": 7, "nodes/1": 2}
        with open_store(empty_url) as store:
            assert store.leader_term() == 5
            with pytest.raises(Fenced):
                store.append("node-a", sharded("nodes/0", 6))
            store.append("node-a", sharded("nodes/0", 7))
            store.append("node-b", sharded("nodes/1", 2))
