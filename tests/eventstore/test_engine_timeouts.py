"""Database calls are bounded: a Postgres session opens within its connect timeout, a statement
runs within its statement timeout, a pooled connection is waited for within the pool timeout,
and each of them is reported as the store's ``StoreTimeout`` naming the limit."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from fleetledger.eventstore import StoreUnavailable, open_store
from fleetledger.eventstore._engine import (
    libpq_conninfo,
    make_engine,
    session_timeouts,
    timeout_error,
)
from fleetledger.eventstore.errors import StoreTimeout


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A local TCP port that accepts connections (the kernel completes the handshake) and
    never answers a byte: a Postgres server as a dead host behind a live address looks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        yield f"postgresql+psycopg://nobody@127.0.0.1:{port}/nothing?sslmode=disable"


def shown(connection: sa.Connection, setting: str) -> str:
    return str(connection.exec_driver_sql(f"SHOW {setting}").scalar_one())


@contextlib.contextmanager
def disposing(engine: sa.Engine) -> Iterator[sa.Engine]:
    try:
        yield engine
    finally:
        engine.dispose()


class TestStatementTimeout:
    def test_a_statement_running_too_long_is_cancelled_as_a_store_timeout(
        self, postgres_url: str
    ) -> None:
        """``pg_sleep`` past the limit is cancelled by the server and reported as the store's
        timeout, naming the limit and how to raise it."""
        with disposing(make_engine(postgres_url, statement_timeout=0.2)) as engine:
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as caught, engine.connect() as connection:
                connection.exec_driver_sql("SELECT pg_sleep(10)")
            elapsed = time.monotonic() - started
            with engine.connect() as connection:
                after = connection.exec_driver_sql("SELECT 1").scalar_one()
        assert caught.value.limit == "statement_timeout"
        assert "statement_timeout" in str(caught.value)
        assert isinstance(caught.value, StoreUnavailable)
        assert elapsed < 5
        assert after == 1

    def test_a_statement_waiting_on_another_sessions_lock_is_cancelled(
        self, postgres_url: str
    ) -> None:
        """A read stuck behind a lock another session holds ends at the limit."""
        with (
            psycopg.connect(libpq_conninfo(postgres_url)) as holder,
            disposing(make_engine(postgres_url, statement_timeout=0.3)) as engine,
        ):
            holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(StoreTimeout) as caught, engine.connect() as connection:
                connection.exec_driver_sql("SELECT count(*) FROM events")
            holder.rollback()
        assert caught.value.limit == "statement_timeout"

    def test_sessions_opened_without_sqlalchemy_have_the_limit_too(self, postgres_url: str) -> None:
        """The appender's and reader's own libpq sessions are cancelled alike; the driver's
        error maps to the same store error."""
        conninfo = libpq_conninfo(postgres_url, statement_timeout=0.2)
        with psycopg.connect(conninfo, autocommit=True) as connection:
            limit = connection.execute("SHOW statement_timeout").fetchone()
            with pytest.raises(psycopg.errors.QueryCanceled) as caught:
                connection.execute("SELECT pg_sleep(10)")
        mapped = timeout_error(caught.value, doing="read from", where="the test database")
        assert limit == ("200ms",)
        assert mapped is not None and mapped.limit == "statement_timeout"

    def test_the_store_opens_its_sessions_with_the_default_limit(self, postgres_url: str) -> None:
        """Without settings of its own, the store's engine runs statements under 30 s."""
        with (
            contextlib.closing(open_store(postgres_url)) as store,
            store.engine.connect() as connection,
        ):
            assert shown(connection, "statement_timeout") == "30s"

    def test_the_urls_own_limit_wins_and_its_other_options_stay(self, postgres_url: str) -> None:
        """A URL setting statement_timeout in its options keeps it, and the rest of them."""
        url = sa.make_url(postgres_url).update_query_dict(
            {"options": "-c statement_timeout=1234 -c application_name=mine"}
        )
        with (
            disposing(make_engine(url.render_as_string(hide_password=False))) as engine,
            engine.connect() as connection,
        ):
            assert shown(connection, "statement_timeout") == "1234ms"
            assert shown(connection, "application_name") == "mine"

    def test_an_idle_listener_outlives_the_statement_timeout(self, postgres_url: str) -> None:
        """The limit bounds a running statement, never an idle session: a listener waiting
        longer than it still gets the next NOTIFY."""
        conninfo = libpq_conninfo(postgres_url, statement_timeout=0.1)
        with (
            psycopg.connect(conninfo, autocommit=True) as listener,
            psycopg.connect(conninfo, autocommit=True) as sender,
        ):
            listener.execute("LISTEN fleetledger_test")
            idle = list(listener.notifies(timeout=0.5))
            sender.execute("NOTIFY fleetledger_test, 'hello'")
            [heard] = listener.notifies(timeout=10, stop_after=1)
        assert idle == []
        assert heard.payload == "hello"


class TestConnectTimeout:
    def test_a_server_that_never_answers_fails_within_the_connect_timeout(
        self, silent_server: str
    ) -> None:
        """Opening a session to a silent server ends after connect_timeout, as the store's
        timeout telling to check the host."""
        with disposing(make_engine(silent_server, connect_timeout=2)) as engine:
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as caught, engine.connect():
                pass
            elapsed = time.monotonic() - started
        assert caught.value.limit == "connect_timeout"
        assert "reachable" in str(caught.value)
        assert 1.5 < elapsed < 6

    def test_the_store_reports_it_when_opened(self, silent_server: str) -> None:
        """``open_store`` on a silent server fails with the same error, in bounded time."""
        started = time.monotonic()
        with pytest.raises(StoreTimeout):
            open_store(silent_server)
        assert time.monotonic() - started < 12

    def test_libpq_sessions_have_the_same_limit(self, silent_server: str) -> None:
        """The store's own libpq sessions give up alike; the driver's error maps to it."""
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(libpq_conninfo(silent_server, connect_timeout=2))
        mapped = timeout_error(caught.value, doing="append to", where="the test database")
        assert time.monotonic() - started < 6
        assert mapped is not None and mapped.limit == "connect_timeout"


class TestPoolTimeout:
    def test_waiting_for_a_busy_pool_ends_at_the_pool_timeout(self, postgres_url: str) -> None:
        """With every pooled connection held, the next caller waits pool_timeout, and the
        error maps to the store's timeout."""
        engine = make_engine(postgres_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
        with (
            disposing(engine),
            engine.connect(),
            pytest.raises(sa.exc.TimeoutError) as caught,
        ):
            engine.connect()
        mapped = timeout_error(caught.value, doing="read from", where="the test database")
        assert mapped is not None and mapped.limit == "pool_timeout"


class TestSettings:
    def test_defaults_are_added_to_the_libpq_connection_string(self) -> None:
        """Five seconds to connect, thirty per statement, whatever else the URL holds."""
        url = "postgresql+psycopg://app@db/log?options=-c%20TimeZone%3DUTC"
        given = conninfo_to_dict(libpq_conninfo(url))
        assert (given["connect_timeout"], given["options"]) == (
            "5",
            "-c TimeZone=UTC -c statement_timeout=30000",
        )

    def test_no_statement_limit_when_asked(self) -> None:
        """``statement_timeout=None`` leaves the server's own setting."""
        assert session_timeouts(sa.make_url("postgresql://db/log"), statement_timeout=None) == {
            "connect_timeout": "5"
        }

    @pytest.mark.parametrize(
        ("settings", "words"),
        [
            ({"connect_timeout": 1}, "at least 2"),
            ({"connect_timeout": True}, "connect_timeout"),
            ({"statement_timeout": 0}, "statement_timeout must be"),
            ({"statement_timeout": float("inf")}, "statement_timeout must be"),
            ({"pool_timeout": 0}, "pool_timeout must be"),
        ],
    )
    def test_bad_settings_say_what_to_fix(self, settings: dict[str, Any], words: str) -> None:
        """Each setting is checked when the engine is made, naming the one to fix."""
        with pytest.raises(ValueError, match=words):
            make_engine("postgresql://db/log", **settings)

    def test_other_errors_are_not_timeouts(self) -> None:
        """A refused connection or a failed statement is left to the store's translation."""
        refused = psycopg.OperationalError("connection refused")
        cancelled = psycopg.errors.QueryCanceled("canceling statement due to user request")
        assert timeout_error(refused, doing="read from", where="x") is None
        assert timeout_error(cancelled, doing="read from", where="x") is None
