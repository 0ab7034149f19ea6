"""Leadership: one lease holder, its term recorded in the log, deposed terms fenced."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.runtime.leadership import (
    FileLease,
    Leadership,
    MemoryLease,
    PostgresLease,
    lease_for,
)
from fleetledger.eventstore import EventStore, Fenced, NewEvent
from fleetledger.eventstore._engine import libpq_conninfo

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


def elector(store: EventStore, board: dict[str, str], holder: str) -> Leadership:
    return Leadership(
        store, MemoryLease(board, holder=holder), clock=ManualClock(EPOCH), holder=holder
    )


class TestElection:
    def test_the_lease_holder_records_the_next_term(self, store: EventStore) -> None:
        """Winning the lease appends LeaderElected with term 1, then 2 for the next winner."""
        board: dict[str, str] = {}
        first, second = elector(store, board, "a"), elector(store, board, "b")

        assert first.step() == "leader"
        assert second.step() == "follower"
        first.stop()
        assert second.step() == "leader"

        elected = [e.data for e in store.read_stream("leadership-default")]
        assert [(e["term"], e["holder"]) for e in elected] == [(1, "a"), (2, "b")]
        assert (first.term(), second.term()) == (None, 2)

    def test_a_lost_lease_steps_down_and_says_so(self, store: EventStore) -> None:
        """The renewal finds the lease gone: the role is follower and the callback has run."""
        board: dict[str, str] = {}
        lease = MemoryLease(board, holder="a")
        leadership = Leadership(store, lease, clock=ManualClock(EPOCH), holder="a")
        reasons: list[str] = []
        leadership.on_deposed(reasons.append)
        leadership.step()

        lease.expire()
        board["leader"] = "b"

        assert leadership.step() == "follower"
        assert reasons == ["the lease was lost"]

    def test_elected_callbacks_get_the_term(self, store: EventStore) -> None:
        """on_elected runs with the term just recorded."""
        leadership = elector(store, {}, "a")
        terms: list[int] = []
        leadership.on_elected(terms.append)

        leadership.step()

        assert terms == [1]


class TestFencing:
    def test_a_deposed_leaders_append_is_refused(self, store: EventStore) -> None:
        """Once term 2 is recorded, an append carrying term 1 is refused by the store."""
        board: dict[str, str] = {}
        old, new = elector(store, board, "a"), elector(store, board, "b")
        old.step()
        board.clear()  # the old holder stalled past its lease
        new.step()

        with pytest.raises(Fenced) as refused:
            store.append("work-1", [NewEvent("Done", {}, metadata={"leader_term": 1})])

        assert (refused.value.term, refused.value.current_term) == (1, 2)

    def test_a_fenced_report_steps_the_leader_down(self, store: EventStore) -> None:
        """The host reports a fenced append: the process follows at once."""
        leadership = elector(store, {}, "a")
        leadership.step()

        leadership.deposed(Fenced(1, 2))

        assert leadership.role == "follower"

    def test_a_report_about_an_earlier_term_is_ignored(self, store: EventStore) -> None:
        """A late fencing report for a term this process no longer holds changes nothing."""
        board: dict[str, str] = {}
        leadership = elector(store, board, "a")
        leadership.step()
        leadership.stop()
        leadership.step()  # elected again: term 2

        leadership.deposed(Fenced(1, 2))

        assert leadership.term() == 2


class TestFileLease:
    def test_one_holder_at_a_time(self, tmp_path: Path) -> None:
        """A second lease on the same file is refused until the first is released."""
        first, second = FileLease(tmp_path / "db.leader"), FileLease(tmp_path / "db.leader")

        assert first.try_acquire()
        assert not second.try_acquire()
        first.release()
        assert second.try_acquire()
        second.release()

    def test_sqlite_gets_a_lock_file_beside_the_database(self, tmp_path: Path) -> None:
        """lease_for a SQLite file is a file lease; in-memory SQLite cannot elect."""
        assert isinstance(lease_for(f"sqlite:///{tmp_path / 'x.db'}"), FileLease)
        with pytest.raises(ValueError, match="in-memory"):
            lease_for("sqlite://")


@pytest.mark.postgres
class TestPostgresLease:
    def test_one_holder_at_a_time(self, postgres_url: str) -> None:
        """The advisory lock admits one holder; releasing it admits the next."""
        first, second = PostgresLease(postgres_url), PostgresLease(postgres_url)
        try:
            assert first.try_acquire()
            assert not second.try_acquire()
            first.release()
            assert second.try_acquire()
        finally:
            first.release()
            second.release()

    def test_a_terminated_session_is_a_lost_lease(self, postgres_url: str) -> None:
        """pg_terminate_backend on the lease's connection: the renewal reports it lost, and
        another process can take the lease."""
        lease, other = PostgresLease(postgres_url), PostgresLease(postgres_url)
        try:
            assert lease.try_acquire()
            with contextlib.closing(psycopg.connect(libpq_conninfo(postgres_url))) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'fleetledger-leader-lease' AND pid <> %s",
                    (os.getpid(),),
                )
                conn.commit()

            assert not lease.check()
            assert other.try_acquire()
        finally:
            lease.release()
            other.release()

    def test_the_lease_session_ends_when_its_holder_goes_silent(self, postgres_url: str) -> None:
        """The lease connection carries idle_session_timeout = the lease time, so a holder that
        stops renewing (a frozen process) loses the lock on the server's side."""
        lease = PostgresLease(postgres_url, lease_seconds=7)
        try:
            assert lease.try_acquire()
            assert lease._conn is not None
            row = lease._conn.execute("SHOW idle_session_timeout").fetchone()
            assert row is not None and row[0] == "7s"
        finally:
            lease.release()
