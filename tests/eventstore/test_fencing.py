"""Fencing: an append carrying a leader term older than the latest recorded one is refused."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetledger.eventstore import (
    NO_STREAM,
    AppendResult,
    EventStore,
    Fenced,
    InvalidEvent,
    NewEvent,
    StreamAppend,
    open_store,
)
from fleetledger.eventstore._chain import chain_hash, from_epoch_micros, now_micros
from fleetledger.eventstore._encoding import prepare_append
from fleetledger.eventstore._engine import libpq_conninfo
from tests.eventstore.support import fresh_ids, new_events

WAIT = 10.0


def termed(term: int | None, count: int = 1, *, type: str = "Tested") -> list[NewEvent]:
    """``count`` events whose metadata carries ``term`` (none for None)."""
    metadata = {} if term is None else {"leader_term": term, "actor": "test"}
    return [NewEvent(type, {"n": n}, metadata=metadata) for n in range(count)]


def elect(store: EventStore, term: int) -> AppendResult:
    """What the runtime does on winning an election: a LeaderElected at the next version of the
    leadership stream, fenced to the new term."""
    return store.append(
        "leadership",
        [NewEvent("LeaderElected", {"term": term}, metadata={"leader_term": term})],
        expected_version=store.stream_version("leadership"),
    )


def log_terms(store: EventStore) -> list[int]:
    """The terms along the log, in global order."""
    return [e.metadata["leader_term"] for e in store.read_all() if "leader_term" in e.metadata]


class TestFencing:
    def test_a_new_log_has_no_term(self, store: EventStore) -> None:
        """leader_term() is 0 before any append carried a term."""
        store.append("vm-1", new_events(2))

        assert store.leader_term() == 0

    def test_an_election_records_its_term(self, store: EventStore) -> None:
        """An append carrying a term higher than the recorded one raises it."""
        elect(store, 1)
        elect(store, 2)

        assert store.leader_term() == 2

    def test_an_older_term_is_refused_and_nothing_is_written(self, store: EventStore) -> None:
        """An append from a deposed term raises Fenced naming both terms; the log is unchanged."""
        elect(store, 1)
        elect(store, 2)
        head = store.head()

        with pytest.raises(Fenced) as raised:
            store.append("vm-1", termed(1, 3))

        assert (raised.value.term, raised.value.current_term) == (1, 2)
        assert "no longer the leader" in str(raised.value)
        assert store.head() == head
        assert store.stream_version("vm-1") == 0
        assert store.leader_term() == 2

    def test_the_current_term_is_accepted(self, store: EventStore) -> None:
        """The leader keeps appending at its own term."""
        elect(store, 3)

        result = store.append("vm-1", termed(3, 2))

        assert result.stream_version == 2
        assert store.leader_term() == 3

    def test_a_higher_term_is_accepted_and_moves_the_fence(self, store: EventStore) -> None:
        """A term above the recorded one commits and becomes the recorded one."""
        elect(store, 1)

        store.append("vm-1", termed(7))

        assert store.leader_term() == 7
        with pytest.raises(Fenced):
            store.append("vm-1", termed(6))

    def test_appends_without_a_term_are_unaffected(self, store: EventStore) -> None:
        """Appends whose metadata has no term (CLI, tests, users) pass whatever the fence."""
        elect(store, 5)

        store.append("vm-1", new_events(1))
        store.append("vm-1", [NewEvent("Tested", {}, metadata={"actor": "cli"})])

        assert store.stream_version("vm-1") == 2
        assert store.leader_term() == 5

    def test_only_the_top_level_key_is_a_term(self, store: EventStore) -> None:
        """A nested ``leader_term`` key or the text in a value is not a fencing term."""
        elect(store, 5)

        store.append(
            "vm-1",
            [
                NewEvent("Tested", {}, metadata={"labels": {"leader_term": 1}}),
                NewEvent("Tested", {}, metadata={"note": '"leader_term"'}),
            ],
        )

        assert store.stream_version("vm-1") == 2

    def test_fenced_wins_over_a_version_conflict(self, store: EventStore) -> None:
        """A deposed writer is told it was deposed, not to reload and retry."""
        elect(store, 2)
        store.append("vm-1", new_events(1))

        with pytest.raises(Fenced):
            store.append("vm-1", termed(1), expected_version=NO_STREAM)

    def test_a_stale_part_refuses_the_whole_append_many(self, store: EventStore) -> None:
        """append_many with one stale part writes nothing in any stream."""
        elect(store, 2)
        head = store.head()

        with pytest.raises(Fenced):
            store.append_many(
                [StreamAppend("vm-a", new_events(1)), StreamAppend("vm-b", termed(1))]
            )

        assert store.head() == head

    def test_the_recorded_term_survives_reopening(self, store_url: str) -> None:
        """The fence is in the database, not in the process that raised it."""
        with open_store(store_url) as first:
            elect(first, 1)
            elect(first, 2)

        with open_store(store_url) as second, pytest.raises(Fenced):
            second.append("vm-1", termed(1))


class TestFencedReplays:
    def test_a_replay_from_before_the_fence_moved_returns_the_original(
        self, store: EventStore
    ) -> None:
        """Re-sending an append that landed at term 1 answers its original result after
        term 2 is elected: it was written while its writer led."""
        elect(store, 1)
        ids = fresh_ids(2)
        events = [
            NewEvent("Tested", {"n": n}, metadata={"leader_term": 1}, event_id=i)
            for n, i in enumerate(ids)
        ]
        original = store.append("vm-1", events, expected_version=NO_STREAM)
        elect(store, 2)

        assert store.append("vm-1", events, expected_version=NO_STREAM) == original
        assert store.stream_version("vm-1") == 2

    def test_new_events_from_the_old_term_are_still_refused(self, store: EventStore) -> None:
        """Only a faithful replay passes; the same writer's next append is refused."""
        elect(store, 1)
        store.append("vm-1", termed(1))
        elect(store, 2)

        with pytest.raises(Fenced):
            store.append("vm-1", termed(1))


class TestInvalidTerms:
    @pytest.mark.parametrize("value", [0, -1, True, "3", 3.0, None, 2**63, [1]])
    def test_a_term_must_be_a_positive_int(self, store: EventStore, value: Any) -> None:
        """Anything but an int from 1 to 2**63 - 1 under the key is refused, naming the key."""
        with pytest.raises(InvalidEvent, match="'leader_term'"):
            store.append("vm-1", [NewEvent("Tested", {}, metadata={"leader_term": value})])

        assert store.head() == 0

    def test_terms_may_not_go_down_within_an_append(self, store: EventStore) -> None:
        """An append whose events carry term 3 then term 2 could never be written whole."""
        with pytest.raises(InvalidEvent, match="term 2 after term 3"):
            store.append("vm-1", [*termed(3), *termed(2)])

    def test_terms_may_not_go_down_across_append_many(self, store: EventStore) -> None:
        """The same holds across the parts of append_many, in the caller's order."""
        with pytest.raises(InvalidEvent, match="append_many"):
            store.append_many([StreamAppend("vm-a", termed(3)), StreamAppend("vm-b", termed(2))])

    def test_terms_may_rise_within_an_append(self, store: EventStore) -> None:
        """An append carrying terms 1 then 2 records term 2."""
        store.append("vm-1", [*termed(1), *termed(2)])

        assert store.leader_term() == 2


class TestFencingInAGroupCommit:
    def test_a_fenced_caller_fails_alone(self, store_url: str) -> None:
        """In one group commit a stale caller gets Fenced and the others commit, even when
        the writer's cached view missed the election (another process made it)."""
        with open_store(store_url) as writer, open_store(store_url) as elector:
            elect(writer, 1)  # the writer's view now holds term 1
            elect(elector, 2)
            group = [
                (prepare_append("vm-a", new_events(1), NO_STREAM),),
                (prepare_append("vm-b", termed(1), NO_STREAM),),
                (prepare_append("vm-c", termed(2), NO_STREAM),),
                (prepare_append("vm-d", termed(3), NO_STREAM),),
            ]

            outcomes = writer.backend.commit(group)

            assert [type(o) for o in outcomes] == [list, Fenced, list, list]
            fenced = outcomes[1]
            assert isinstance(fenced, Fenced)
            assert (fenced.term, fenced.current_term) == (1, 2)
            versions = [writer.stream_version(s) for s in ("vm-a", "vm-b", "vm-c", "vm-d")]
            assert versions == [1, 0, 1, 1]
            assert writer.leader_term() == 3
            assert writer.verify().ok

    def test_an_election_in_the_group_fences_the_callers_after_it(self, store: EventStore) -> None:
        """A caller queued behind an election in the same group is judged against it, and one
        queued before it is not."""
        elect(store, 1)
        group = [
            (prepare_append("vm-a", termed(1), NO_STREAM),),
            (prepare_append("leadership", termed(2, type="LeaderElected"), 1),),
            (prepare_append("vm-b", termed(1), NO_STREAM),),
        ]

        outcomes = store.backend.commit(group)

        assert [type(o) for o in outcomes] == [list, list, Fenced]
        assert log_terms(store) == [1, 1, 2]


class TestFencingInvariant:
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(steps=st.lists(st.lists(st.integers(-2, 2) | st.none(), max_size=3), max_size=8))
    def test_an_append_passes_exactly_when_no_term_is_below_the_recorded_one(
        self, store: EventStore, steps: list[list[int | None]]
    ) -> None:
        """Over any sequence of appends with terms near the recorded one, each is accepted iff
        its lowest term is at least the recorded term, the recorded term is the highest
        accepted, and the terms along the log never go down."""
        for offsets in steps:
            recorded = store.leader_term()
            terms = sorted(max(1, recorded + o) for o in offsets if o is not None)
            events = [NewEvent("Tested", {}, metadata={"leader_term": t}) for t in terms]
            events += termed(None, len(offsets) - len(terms))
            if not events:
                continue
            if terms and terms[0] < recorded:
                with pytest.raises(Fenced):
                    store.append(f"vm-{uuid.uuid4()}", events)
                assert store.leader_term() == recorded
            else:
                store.append(f"vm-{uuid.uuid4()}", events)
                assert store.leader_term() == max([recorded, *terms])
        along = log_terms(store)
        assert along == sorted(along)


# -- Postgres: the database orders a stale append and an election racing on two connections --


@contextlib.contextmanager
def raw_transaction(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection in an open transaction, rolled back unless the test commits it."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        try:
            yield conn
        finally:
            conn.rollback()


def insert_raw_event(
    conn: psycopg.Connection[Any], stream: str, version: int, term: int, *, skip: int = 0
) -> None:
    """Insert an event fenced to ``term`` at the head (or ``skip`` positions past it), chained
    to the head, as another process's appender would: fenced by the database in the same
    statement."""
    row = conn.execute(
        "SELECT global_position, hash FROM events ORDER BY global_position DESC LIMIT 1"
    ).fetchone()
    assert row is not None
    position, previous = row[0] + 1 + skip, bytes(row[1])
    event_id, recorded_us = str(uuid.uuid4()), now_micros()
    data_text, metadata_text = f'{{"term":{term}}}', f'{{"leader_term":{term}}}'
    digest = chain_hash(
        previous,
        position=position,
        stream_id=stream,
        stream_version=version,
        event_id=event_id,
        type="LeaderElected",
        schema_version=1,
        recorded_at_us=recorded_us,
        data_text=data_text,
        metadata_text=metadata_text,
    )
    conn.execute(
        "WITH fence AS (SELECT fleetledger_fence(%s, %s) AS ok) "
        "INSERT INTO events (global_position, stream_id, stream_version, event_id, type, "
        "schema_version, data, metadata, recorded_at, hash) "
        "SELECT %s, %s, %s, %s, 'LeaderElected', 1, %s::json, %s::json, %s, %s "
        "FROM fence WHERE fence.ok",
        (
            term,
            term,
            position,
            stream,
            version,
            uuid.UUID(event_id),
            data_text,
            metadata_text,
            from_epoch_micros(recorded_us),
            digest,
        ),
    )


def wait_for_a_lock_wait(url: str) -> None:
    """Block until some session of the test's database waits on a lock.

    A bounded poll of a state, not a bet on timing: the test goes on the moment the append
    under test is parked behind the open transaction.
    """
    deadline = time.monotonic() + WAIT
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"no session waited on a lock within {WAIT} s")
            time.sleep(0.005)


def in_thread(work: Any) -> Future[Any]:
    """Run ``work`` in a daemon thread; its outcome lands in the future."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=run, daemon=True).start()
    return future


class TestFencingRaceOnPostgres:
    def test_a_stale_append_racing_an_election_is_refused_after_it(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """With the election's transaction open on another connection, a term-1 append waits
        for it, and once it commits is refused as Fenced; nothing of it is written."""
        store = postgres_store
        elect(store, 1)  # the store's cached view: term 1, head 1
        with raw_transaction(postgres_url) as election:
            insert_raw_event(election, "leadership", 2, term=2)
            stale = in_thread(lambda: store.append("vm-1", termed(1)))
            wait_for_a_lock_wait(postgres_url)
            assert not stale.done()
            election.commit()

            with pytest.raises(Fenced) as raised:
                stale.result(timeout=WAIT)

        assert (raised.value.term, raised.value.current_term) == (1, 2)
        assert store.stream_version("vm-1") == 0
        assert (store.head(), store.leader_term()) == (2, 2)
        assert store.verify().ok

    def test_a_stale_append_that_got_in_first_commits_before_the_election(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """With a term-1 append's transaction open, the election waits for it and then
        commits after it: the log shows term 1 then term 2, never the reverse."""
        store = postgres_store
        elect(store, 1)
        with raw_transaction(postgres_url) as stale:
            insert_raw_event(stale, "vm-stale", 1, term=1)
            election = in_thread(lambda: elect(store, 2))
            wait_for_a_lock_wait(postgres_url)
            assert not election.done()
            stale.commit()

            result = election.result(timeout=WAIT)

        assert result.first_position == 3
        assert log_terms(store) == [1, 1, 2]
        assert store.leader_term() == 2
        assert store.verify().ok

    def test_the_database_alone_orders_two_racing_fenced_inserts(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """Two fenced inserts that do not meet on any unique index: the stale one waits for
        the open election and is refused when it commits, by the database's fence alone."""
        elect(postgres_store, 1)
        with raw_transaction(postgres_url) as election, raw_transaction(postgres_url) as stale:
            insert_raw_event(election, "leadership", 2, term=2)
            refused = in_thread(lambda: insert_raw_event(stale, "vm-stale", 1, term=1, skip=1))
            wait_for_a_lock_wait(postgres_url)
            assert not refused.done()
            election.commit()

            with pytest.raises(psycopg.Error) as raised:
                refused.result(timeout=WAIT)

        assert raised.value.sqlstate == "LT001"
        assert postgres_store.leader_term() == 2

    def test_the_database_refuses_a_stale_term_itself(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """The fence refuses a term below the recorded one with SQLSTATE LT001 (which the
        store's appender maps to Fenced), and the statement inserts nothing."""
        elect(postgres_store, 2)
        with (
            raw_transaction(postgres_url) as conn,
            pytest.raises(psycopg.Error) as raised,
        ):
            insert_raw_event(conn, "vm-raw", 1, term=1)

        assert raised.value.sqlstate == "LT001"
        assert postgres_store.head() == 1
