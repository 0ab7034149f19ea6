"""Engine set-up: what every Postgres session of the store agrees on."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from datetime import UTC, timedelta
from pathlib import Path

import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from fleetledger.eventstore import open_store
from fleetledger.eventstore._engine import libpq_conninfo, make_engine
from tests.eventstore.support import new_events


class TestPostgresSessions:
    def test_timestamps_come_back_in_utc_whatever_the_server_time_zone(
        self, postgres_url: str
    ) -> None:
        """A session that starts in another zone still reads recorded_at as UTC."""
        elsewhere = sa.make_url(postgres_url).update_query_dict(
            {"options": "-c TimeZone=America/New_York"}
        )
        with contextlib.closing(open_store(elsewhere.render_as_string(hide_password=False))) as s:
            s.append("vm-1", new_events(1))
            read = [*s.read_all(), *s.read_stream("vm-1")]

        assert [e.recorded_at.utcoffset() for e in read] == [timedelta(0), timedelta(0)]
        assert all(e.recorded_at.tzinfo is UTC for e in read)


class TestSqliteConnections:
    def test_a_connection_waits_for_a_writer_to_switch_a_new_file_to_wal(
        self, tmp_path: Path
    ) -> None:
        """Switching to WAL fails at once while another process writes to a file still in its
        first journal mode; the connection waits for that writer and switches after it."""
        path = tmp_path / "new.db"
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("CREATE TABLE first (id INTEGER)")
        engine = make_engine(f"sqlite:///{path}")
        waiting = threading.Event()

        def watch(connection: sqlite3.Connection, _record: object) -> None:
            # Run before fleetledger's own connect hook: tells the test when the WAL switch
            # has met the lock and is queuing behind the writer.
            connection.set_trace_callback(
                lambda sql: waiting.set() if sql == "BEGIN IMMEDIATE" else None
            )

        sa.event.listen(engine, "connect", watch, insert=True)
        journal_modes: list[str] = []

        def open_connection() -> None:
            with engine.connect() as connection:
                journal_modes.append(connection.exec_driver_sql("PRAGMA journal_mode").scalar_one())

        opened = threading.Thread(target=open_connection)
        opened.start()
        assert waiting.wait(timeout=30)
        writer.execute("COMMIT")
        opened.join(timeout=30)
        writer.close()
        engine.dispose()

        assert journal_modes == ["wal"]


class TestLibpqConninfo:
    def test_query_options_keep_their_spaces(self) -> None:
        """What went wrong when the URL was re-rendered: libpq read '+' literally."""
        url = "postgresql+psycopg://app@db:5433/log?options=-c%20TimeZone%3DUTC&sslmode=require"

        assert conninfo_to_dict(libpq_conninfo(url)) == {
            "host": "db",
            "port": "5433",
            "user": "app",
            "dbname": "log",
            "options": "-c TimeZone=UTC -c statement_timeout=30000",
            "sslmode": "require",
            "connect_timeout": "5",
        }

    def test_a_password_with_url_syntax_survives(self) -> None:
        url = "postgresql://app:p%40ss%3Aw%2Frd@db/log"

        assert conninfo_to_dict(libpq_conninfo(url))["password"] == "p@ss:w/rd"


class TestSqliteDurability:
    def _synchronous(self, tmp_path: Path, **options: bool) -> int:
        engine = make_engine(f"sqlite:///{tmp_path / 'log.db'}", **options)
        try:
            with engine.connect() as conn:
                return int(conn.exec_driver_sql("PRAGMA synchronous").scalar_one())
        finally:
            engine.dispose()

    def test_a_commit_reaches_the_disk_before_it_is_acknowledged(self, tmp_path: Path) -> None:
        """The default: synchronous=FULL (2), an acknowledged append survives power loss."""
        assert self._synchronous(tmp_path) == 2

    def test_a_scratch_log_never_waits_for_the_disk(self, tmp_path: Path) -> None:
        """durable=False: synchronous=OFF (0), which in WAL mode survives a process crash."""
        assert self._synchronous(tmp_path, durable=False) == 0
