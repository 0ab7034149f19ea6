"""Leadership: one lease holder, its term recorded in the log, deposed terms fenced."""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.runtime import Deposed, HostedStream, Shard, Writer
from fleetledger.adapters.runtime.leadership import (
    DutyFencing,
    FileLease,
    Leadership,
    MemoryLease,
    PostgresLease,
    lease_for,
)
from fleetledger.eventstore import EventStore, Fenced, NewEvent
from fleetledger.eventstore._engine import libpq_conninfo

from .test_example_aggregate import COUNTER, Command, Counter, Event, Increment

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


def shard_elector(
    store: EventStore, board: dict[str, str], holder: str, shard: Shard | str
) -> Leadership:
    name = shard if isinstance(shard, str) else shard.name
    return Leadership(
        store,
        MemoryLease(board, holder=holder, name=name),
        clock=ManualClock(EPOCH),
        holder=holder,
        shard=shard,
    )


def counter(
    store: EventStore, stream_id: str, leadership: Leadership
) -> HostedStream[Counter, Command, Event]:
    """A hosted stream whose duties are fenced by ``leadership``."""
    return HostedStream(
        store,
        COUNTER,
        stream_id,
        clock=ManualClock(EPOCH),
        writer=Writer(fencing=DutyFencing(leadership)),
    )


def bump(request_id: str) -> object:
    return lambda at: [(Increment(request_id, 1, at), request_id)]


def fence_of(store: EventStore, stream_id: str) -> list[tuple[object, object]]:
    """(leader_term, leader_shard) of each event of ``stream_id``."""
    return [
        (e.metadata.get("leader_term"), e.metadata.get("leader_shard"))
        for e in store.read_stream(stream_id)
    ]


class TestShards:
    def test_two_shards_lead_at_once(self, store: EventStore) -> None:
        """Leaderships of two shards each win their own lease and record term 1 in their own
        stream, naming their shard beside the term."""
        board: dict[str, str] = {}
        first = shard_elector(store, board, "a", Shard("nodes", 0, 2))
        second = shard_elector(store, board, "b", "nodes/1-of-2")

        assert (first.step(), second.step()) == ("leader", "leader")

        assert (first.term(), second.term()) == (1, 1)
        assert (first.stream_id, second.stream_id) == (
            "leadership-nodes/0-of-2",
            "leadership-nodes/1-of-2",
        )
        assert fence_of(store, "leadership-nodes/0-of-2") == [(1, "nodes/0-of-2")]
        assert fence_of(store, "leadership-nodes/1-of-2") == [(1, "nodes/1-of-2")]

    def test_a_shards_next_leader_takes_the_next_term_of_that_shard(
        self, store: EventStore
    ) -> None:
        """Terms count per shard: the second leader of nodes/0-of-2 is term 2 whatever other shards
        and the single leadership have recorded."""
        board: dict[str, str] = {}
        elector(store, board, "single").step()
        shard_elector(store, board, "x", "nodes/1-of-2").step()
        old = shard_elector(store, board, "a", "nodes/0-of-2")
        old.step()
        old.stop()

        new = shard_elector(store, board, "b", "nodes/0-of-2")

        assert new.step() == "leader"
        assert (new.term(), new.latest_term()) == (2, 2)

    def test_a_deposed_shard_leaders_duty_is_refused_and_the_other_shard_goes_on(
        self, store: EventStore
    ) -> None:
        """nodes/0-of-2 passes to a new leader (term 2): the old leader's next duty append is
        refused and it steps down, while nodes/1-of-2's leader appends on at its term 1."""
        board: dict[str, str] = {}
        old = shard_elector(store, board, "a", "nodes/0-of-2")
        other = shard_elector(store, board, "b", "nodes/1-of-2")
        old.step()
        other.step()
        old_stream, other_stream = (
            counter(store, "counter-0", old),
            counter(store, "counter-1", other),
        )
        old_stream.execute(bump("before"), duty=True)  # type: ignore[arg-type]

        del board["nodes/0-of-2"]  # the old holder stalled past its lease
        new = shard_elector(store, board, "c", "nodes/0-of-2")
        assert new.step() == "leader"

        with pytest.raises(Deposed):
            old_stream.execute(bump("stale"), duty=True)  # type: ignore[arg-type]
        other_stream.execute(bump("on"), duty=True)  # type: ignore[arg-type]

        assert old.role == "follower"
        assert fence_of(store, "counter-0") == [(1, "nodes/0-of-2")]
        assert fence_of(store, "counter-1") == [(1, "nodes/1-of-2")]
        assert (store.leader_term("nodes/0-of-2"), store.leader_term("nodes/1-of-2")) == (2, 1)

    def test_only_duties_name_the_shard(self, store: EventStore) -> None:
        """A command that is no duty carries neither term nor shard (the store refuses a
        shard without a term), and an unsharded leader's duties carry no shard."""
        board: dict[str, str] = {}
        sharded = shard_elector(store, board, "a", "nodes/0-of-2")
        single = elector(store, board, "b")
        sharded.step()
        single.step()

        counter(store, "counter-s", sharded).execute(bump("plain"))  # type: ignore[arg-type]
        counter(store, "counter-u", single).execute(bump("duty"), duty=True)  # type: ignore[arg-type]

        assert fence_of(store, "counter-s") == [(None, None)]
        [duty] = store.read_stream("counter-u")
        assert duty.metadata.get("leader_term") == 1
        assert "leader_shard" not in duty.metadata

    def test_a_shard_names_the_leadership_instead_of_a_scope(self, store: EventStore) -> None:
        """Giving both a scope and a shard, or a shard name the store would refuse, is refused
        at construction."""
        lease = MemoryLease({}, holder="a")
        with pytest.raises(ValueError, match="not both"):
            Leadership(store, lease, clock=ManualClock(EPOCH), scope="x", shard="nodes/0-of-2")
        with pytest.raises(ValueError, match="shard name"):
            Leadership(store, lease, clock=ManualClock(EPOCH), shard="nodes 0")

    def test_the_duty_fencing_names_the_shard(self, store: EventStore) -> None:
        """DutyFencing tells the host which shard its terms are of (None: log-wide)."""
        assert DutyFencing(shard_elector(store, {}, "a", "nodes/3-of-2")).shard == "nodes/3-of-2"
        assert DutyFencing(elector(store, {}, "a")).shard is None


@pytest.mark.postgres
class TestPostgresShardLeases:
    def test_two_shards_and_the_single_leader_hold_their_locks_at_once(
        self, postgres_url: str
    ) -> None:
        """Each shard's advisory lock has its own key: two shards' leases (and the single
        leader's) are held from their own connections at once, while a second lease of the
        same shard is refused until the first is released."""
        first = lease_for(postgres_url, shard=Shard("nodes", 0, 2))
        second = lease_for(postgres_url, shard=Shard("nodes", 1, 2))
        rival = lease_for(postgres_url, shard="nodes/0-of-2")
        single = lease_for(postgres_url)
        leases = (first, second, rival, single)
        assert all(isinstance(lease, PostgresLease) for lease in leases)
        try:
            assert first.try_acquire() and second.try_acquire() and single.try_acquire()
            assert not rival.try_acquire()
            first.release()
            assert rival.try_acquire()
        finally:
            for lease in leases:
                lease.release()

    def test_two_shards_lead_at_once_on_postgres(
        self, postgres_url: str, postgres_store: EventStore
    ) -> None:
        """Leaderships of nodes/0-of-2 and nodes/1-of-2 on their real leases both lead, each at
        term 1."""
        leaderships = [
            Leadership(
                postgres_store,
                lease_for(postgres_url, shard=shard),
                clock=ManualClock(EPOCH),
                holder=f"p{shard.partition}",
                shard=shard,
            )
            for shard in (Shard("nodes", 0, 2), Shard("nodes", 1, 2))
        ]
        try:
            assert [leadership.step() for leadership in leaderships] == ["leader", "leader"]
            assert [leadership.term() for leadership in leaderships] == [1, 1]
        finally:
            for leadership in leaderships:
                leadership.stop()
