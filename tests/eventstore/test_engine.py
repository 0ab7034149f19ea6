"""Engine set-up: what every Postgres session of the store agrees on."""

from __future__ import annotations

import contextlib
from datetime import UTC, timedelta

import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from fleetledger.eventstore import open_store
from fleetledger.eventstore._engine import libpq_conninfo
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


class TestLibpqConninfo:
    def test_query_options_keep_their_spaces(self) -> None:
        """What went wrong when the URL was re-rendered: libpq read '+' literally."""
        url = "postgresql+psycopg://app@db:5433/log?options=-c%20TimeZone%3DUTC&sslmode=require"

        assert conninfo_to_dict(libpq_conninfo(url)) == {
            "host": "db",
            "port": "5433",
            "user": "app",
            "dbname": "log",
            "options": "-c TimeZone=UTC",
            "sslmode": "require",
        }

    def test_a_password_with_url_syntax_survives(self) -> None:
        url = "postgresql://app:p%40ss%3Aw%2Frd@db/log"

        assert conninfo_to_dict(libpq_conninfo(url))["password"] == "p@ss:w/rd"
