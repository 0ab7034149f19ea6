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


# -- Fencing per shard: "leader_shard" beside "leader_term" fences on that shard's own term --


def shard_termed(shard: str, term: int, count: int = 1, *, type: str = "Tested") -> list[NewEvent]:
    """``count`` events fenced to ``term`` of ``shard``."""
    metadata = {"leader_term": term, "leader_shard": shard, "actor": "test"}
    return [NewEvent(type, {"n": n}, metadata=metadata) for n in range(count)]


def elect_shard(store: EventStore, shard: str, term: int) -> AppendResult:
    """What a shard's runtime does on winning its election: a LeaderElected on the shard's
    leadership stream, fenced to the shard's new term."""
    stream = f"leadership-{shard}"
    return store.append(
        stream,
        shard_termed(shard, term, type="LeaderElected"),
        expected_version=store.stream_version(stream),
    )


def shard_terms_along_the_log(store: EventStore, shard: str) -> list[int]:
    """The terms of ``shard`` along the log, in global order."""
    return [
        e.metadata["leader_term"]
        for e in store.read_all()
        if e.metadata.get("leader_shard") == shard
    ]


class TestShardFencing:
    def test_a_shard_never_named_is_at_term_zero(self, store: EventStore) -> None:
        """leader_term(shard) is 0 before any append named the shard, whatever else is logged."""
        elect(store, 4)
        elect_shard(store, "nodes/0", 3)

        assert store.leader_term("nodes/1") == 0

    def test_an_election_records_the_shards_term_only(self, store: EventStore) -> None:
        """An append carrying a shard's term raises that shard's recorded term, not the
        log-wide one nor another shard's."""
        elect_shard(store, "nodes/0", 1)
        elect_shard(store, "nodes/0", 2)

        assert store.leader_term("nodes/0") == 2
        assert store.leader_term() == 0
        assert store.leader_term("nodes/1") == 0

    def test_an_older_term_of_the_shard_is_refused_and_nothing_is_written(
        self, store: EventStore
    ) -> None:
        """An append from a deposed term of the shard raises Fenced naming both terms; the log
        and the shard's term are unchanged."""
        elect_shard(store, "nodes/0", 1)
        elect_shard(store, "nodes/0", 2)
        head = store.head()

        with pytest.raises(Fenced) as raised:
            store.append("node-a", shard_termed("nodes/0", 1, 3))

        assert (raised.value.term, raised.value.current_term) == (1, 2)
        assert store.head() == head
        assert store.stream_version("node-a") == 0
        assert store.leader_term("nodes/0") == 2

    def test_the_shards_current_term_is_accepted(self, store: EventStore) -> None:
        """The shard's leader keeps appending at its own term."""
        elect_shard(store, "nodes/0", 3)

        result = store.append("node-a", shard_termed("nodes/0", 3, 2))

        assert result.stream_version == 2
        assert store.leader_term("nodes/0") == 3

    def test_shards_are_fenced_independently(self, store: EventStore) -> None:
        """nodes/0 at term 7 does not fence nodes/1 at term 1, and a higher term of nodes/1
        leaves nodes/0 where it was."""
        elect_shard(store, "nodes/0", 7)

        store.append("node-b", shard_termed("nodes/1", 1))
        store.append("node-b", shard_termed("nodes/1", 2))

        assert (store.leader_term("nodes/0"), store.leader_term("nodes/1")) == (7, 2)
        with pytest.raises(Fenced) as raised:
            store.append("node-a", shard_termed("nodes/0", 6))
        assert (raised.value.term, raised.value.current_term) == (6, 7)

    def test_the_log_wide_fence_and_the_shards_are_independent(self, store: EventStore) -> None:
        """A log-wide term does not fence a shard's appends, nor a shard's term the appends
        without a shard; each is refused by its own fence only."""
        elect(store, 5)
        store.append("node-a", shard_termed("nodes/0", 1))
        elect_shard(store, "nodes/0", 9)
        store.append("vm-1", termed(5))

        with pytest.raises(Fenced) as log_wide:
            store.append("vm-1", termed(3))
        with pytest.raises(Fenced) as of_shard:
            store.append("node-a", shard_termed("nodes/0", 8))

        assert (log_wide.value.term, log_wide.value.current_term) == (3, 5)
        assert (of_shard.value.term, of_shard.value.current_term) == (8, 9)
        assert (store.leader_term(), store.leader_term("nodes/0")) == (5, 9)

    def test_a_stale_part_refuses_the_whole_append_many(self, store: EventStore) -> None:
        """append_many whose part of one shard is stale writes nothing in any stream, though
        its part of another shard is current."""
        elect_shard(store, "nodes/0", 2)
        elect_shard(store, "nodes/1", 3)
        head = store.head()

        with pytest.raises(Fenced) as raised:
            store.append_many(
                [
                    StreamAppend("node-a", shard_termed("nodes/0", 2)),
                    StreamAppend("node-b", shard_termed("nodes/1", 1)),
                ]
            )

        assert (raised.value.term, raised.value.current_term) == (1, 3)
        assert store.head() == head

    def test_append_many_raises_each_shard_it_names(self, store: EventStore) -> None:
        """Parts of different shards, in any order, each raise their own shard's term, and
        the log-wide one is raised by the part without a shard."""
        store.append_many(
            [
                StreamAppend("node-b", shard_termed("nodes/1", 2)),
                StreamAppend("vm-1", termed(3)),
                StreamAppend("node-a", shard_termed("nodes/0", 4)),
            ]
        )

        assert store.leader_term("nodes/0") == 4
        assert store.leader_term("nodes/1") == 2
        assert store.leader_term() == 3
        with pytest.raises(Fenced):
            store.append_many(
                [
                    StreamAppend("node-b", shard_termed("nodes/1", 2)),
                    StreamAppend("node-a", shard_termed("nodes/0", 3)),
                ]
            )

    def test_the_shards_term_survives_reopening(self, store_url: str) -> None:
        """The shard's fence is in the database, not in the process that raised it."""
        with open_store(store_url) as first:
            elect_shard(first, "nodes/0", 1)
            elect_shard(first, "nodes/0", 2)

        with open_store(store_url) as second:
            assert second.leader_term("nodes/0") == 2
            with pytest.raises(Fenced):
                second.append("node-a", shard_termed("nodes/0", 1))

    def test_a_replay_from_before_the_shard_fence_moved_returns_the_original(
        self, store: EventStore
    ) -> None:
        """Re-sending an append that landed at a shard's term 1 answers its original result
        after the shard elected term 2; new events at term 1 are refused."""
        elect_shard(store, "nodes/0", 1)
        events = [
            NewEvent(
                "Tested", {}, metadata={"leader_term": 1, "leader_shard": "nodes/0"}, event_id=i
            )
            for i in fresh_ids(2)
        ]
        original = store.append("node-a", events, expected_version=NO_STREAM)
        elect_shard(store, "nodes/0", 2)

        assert store.append("node-a", events, expected_version=NO_STREAM) == original
        with pytest.raises(Fenced):
            store.append("node-a", shard_termed("nodes/0", 1))
        assert store.stream_version("node-a") == 2

    def test_leader_term_refuses_a_malformed_shard_name(self, store: EventStore) -> None:
        """Asking for a shard no append could ever name is a mistake, not a term of 0."""
        with pytest.raises(InvalidEvent, match="shard must be a shard name"):
            store.leader_term("nodes 0")


class TestInvalidShards:
    @pytest.mark.parametrize(
        "value",
        ["", "nodes 0", "nodes:0", "nodes\n0", "nodé/0", "a" * 201, 3, None, ["nodes/0"]],
    )
    def test_a_shard_must_be_a_well_formed_name(self, store: EventStore, value: Any) -> None:
        """Anything but 1 to 200 letters, digits, '.', '_', '/' and '-' is refused, naming the
        key and what is allowed; nothing is written."""
        events = [NewEvent("Tested", {}, metadata={"leader_term": 1, "leader_shard": value})]

        with pytest.raises(InvalidEvent, match=r"'leader_shard'.*letters, digits"):
            store.append("node-a", events)

        assert store.head() == 0
        assert store.leader_term() == 0

    def test_a_shard_name_of_200_characters_is_accepted(self, store: EventStore) -> None:
        name = "nodes/" + "0" * 194

        store.append("node-a", shard_termed(name, 1))

        assert store.leader_term(name) == 1

    def test_a_shard_without_a_term_is_refused(self, store: EventStore) -> None:
        """``leader_shard`` alone fences nothing: it is refused rather than silently ignored."""
        events = [NewEvent("Tested", {}, metadata={"leader_shard": "nodes/0"})]

        with pytest.raises(InvalidEvent, match="'leader_shard' without 'leader_term'"):
            store.append("node-a", events)

        assert store.head() == 0

    @pytest.mark.parametrize(
        "second",
        [shard_termed("nodes/1", 1), termed(1)],
        ids=["another shard", "no shard"],
    )
    def test_one_streams_append_names_one_shard(
        self, store: EventStore, second: list[NewEvent]
    ) -> None:
        """The termed events of one stream's append all name the same shard, or all none."""
        with pytest.raises(InvalidEvent, match="must name the same 'leader_shard'"):
            store.append("node-a", [*shard_termed("nodes/0", 1), *second])

        assert store.head() == 0

    def test_events_without_a_term_may_join_a_shards_append(self, store: EventStore) -> None:
        """An event carrying no term is fenced by nothing, beside a shard's events as beside
        log-wide ones."""
        store.append("node-a", [*shard_termed("nodes/0", 2), *new_events(1)])

        assert store.stream_version("node-a") == 2
        assert store.leader_term("nodes/0") == 2

    def test_a_shards_terms_may_not_go_down_within_an_append(self, store: EventStore) -> None:
        with pytest.raises(InvalidEvent, match="term 2 of shard 'nodes/0' after term 3"):
            store.append("node-a", [*shard_termed("nodes/0", 3), *shard_termed("nodes/0", 2)])

    def test_a_shards_terms_may_not_go_down_across_append_many(self, store: EventStore) -> None:
        with pytest.raises(InvalidEvent, match="append_many"):
            store.append_many(
                [
                    StreamAppend("node-a", shard_termed("nodes/0", 3)),
                    StreamAppend("node-b", shard_termed("nodes/0", 2)),
                ]
            )

        assert store.head() == 0

    def test_terms_of_different_fences_may_differ_across_append_many(
        self, store: EventStore
    ) -> None:
        """Terms of different shards (and the log-wide one) are not compared: a lower term of
        another shard after a higher one is no going back."""
        store.append_many(
            [
                StreamAppend("node-a", shard_termed("nodes/0", 3)),
                StreamAppend("node-b", shard_termed("nodes/1", 2)),
                StreamAppend("vm-1", termed(1)),
            ]
        )

        assert store.head() == 3

    def test_a_malformed_shard_anywhere_refuses_the_whole_append_many(
        self, store: EventStore
    ) -> None:
        with pytest.raises(InvalidEvent, match="'leader_shard'"):
            store.append_many(
                [
                    StreamAppend("node-a", shard_termed("nodes/0", 1)),
                    StreamAppend("node-b", shard_termed("nodes 1", 1)),
                ]
            )

        assert store.head() == 0


class TestShardFencingInAGroupCommit:
    def test_a_fenced_shard_caller_fails_alone(self, store_url: str) -> None:
        """In one group commit a caller stale on its shard gets Fenced and the others commit
        (other shards, the same shard at its current term, log-wide terms, no term), even when
        the writer's cached view missed the shard's election (another process made it)."""
        with open_store(store_url) as writer, open_store(store_url) as elector:
            elect_shard(writer, "nodes/0", 1)  # the writer's view now holds nodes/0 at 1
            elect_shard(elector, "nodes/0", 2)
            group = [
                (prepare_append("vm-a", new_events(1), NO_STREAM),),
                (prepare_append("node-b", shard_termed("nodes/0", 1), NO_STREAM),),
                (prepare_append("node-c", shard_termed("nodes/0", 2), NO_STREAM),),
                (prepare_append("node-d", shard_termed("nodes/1", 1), NO_STREAM),),
                (prepare_append("vm-e", termed(1), NO_STREAM),),
            ]

            outcomes = writer.backend.commit(group)

            assert [type(o) for o in outcomes] == [list, Fenced, list, list, list]
            fenced = outcomes[1]
            assert isinstance(fenced, Fenced)
            assert (fenced.term, fenced.current_term) == (1, 2)
            streams = ("vm-a", "node-b", "node-c", "node-d", "vm-e")
            assert [writer.stream_version(s) for s in streams] == [1, 0, 1, 1, 1]
            terms = [writer.leader_term(s) for s in ("nodes/0", "nodes/1", None)]
            assert terms == [2, 1, 1]
            assert writer.verify().ok

    def test_a_shards_election_in_the_group_fences_that_shards_callers_after_it(
        self, store: EventStore
    ) -> None:
        """A caller of the shard queued behind its election in the same group is judged
        against it; one queued before it, and one of another shard after it, are not."""
        elect_shard(store, "nodes/0", 1)
        group = [
            (prepare_append("node-a", shard_termed("nodes/0", 1), NO_STREAM),),
            (prepare_append("leadership-nodes/0", shard_termed("nodes/0", 2), 1),),
            (prepare_append("node-b", shard_termed("nodes/0", 1), NO_STREAM),),
            (prepare_append("node-c", shard_termed("nodes/1", 1), NO_STREAM),),
        ]

        outcomes = store.backend.commit(group)

        assert [type(o) for o in outcomes] == [list, list, Fenced, list]
        assert shard_terms_along_the_log(store, "nodes/0") == [1, 1, 2]
        assert store.leader_term("nodes/0") == 2


class TestShardFencingInvariant:
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        steps=st.lists(
            st.tuples(st.sampled_from(["nodes/0", "nodes/1", None]), st.integers(-2, 2)),
            max_size=12,
        )
    )
    def test_each_fence_passes_exactly_the_terms_not_below_its_own(
        self, store: EventStore, steps: list[tuple[str | None, int]]
    ) -> None:
        """Over any sequence of appends near their fence's recorded term, each is accepted iff
        its term is at least the recorded term of its own fence (its shard's, or the log-wide
        one), which then records the highest accepted; the other fences never move."""
        recorded: dict[str | None, int] = {
            fence: store.leader_term(fence) for fence in ("nodes/0", "nodes/1", None)
        }
        for fence, offset in steps:
            term = max(1, recorded[fence] + offset)
            events = termed(term) if fence is None else shard_termed(fence, term)
            if term < recorded[fence]:
                with pytest.raises(Fenced):
                    store.append(f"s-{uuid.uuid4()}", events)
            else:
                store.append(f"s-{uuid.uuid4()}", events)
                recorded[fence] = term
            assert {f: store.leader_term(f) for f in recorded} == recorded
        for shard in ("nodes/0", "nodes/1"):
            along = shard_terms_along_the_log(store, shard)
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
    conn: psycopg.Connection[Any],
    stream: str,
    version: int,
    term: int,
    *,
    skip: int = 0,
    shard: str | None = None,
) -> None:
    """Insert an event fenced to ``term`` (of ``shard``, or log-wide) at the head (or ``skip``
    positions past it), chained to the head, as another process's appender would: fenced by the
    database in the same statement."""
    row = conn.execute(
        "SELECT global_position, hash FROM events ORDER BY global_position DESC LIMIT 1"
    ).fetchone()
    assert row is not None
    position, previous = row[0] + 1 + skip, bytes(row[1])
    event_id, recorded_us = str(uuid.uuid4()), now_micros()
    data_text = f'{{"term":{term}}}'
    metadata_text = (
        f'{{"leader_term":{term}}}'
        if shard is None
        else f'{{"leader_shard":"{shard}","leader_term":{term}}}'
    )
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
    fence, fence_params = (
        ("fleetledger_fence(%s, %s)", (term, term))
        if shard is None
        else (
            "fleetledger_fence_shards(%s::text[], %s::bigint[], %s::bigint[])",
            ([shard], [term], [term]),
        )
    )
    conn.execute(
        f"WITH fence AS (SELECT {fence} AS ok) "
        "INSERT INTO events (global_position, stream_id, stream_version, event_id, type, "
        "schema_version, data, metadata, recorded_at, hash) "
        "SELECT %s, %s, %s, %s, 'LeaderElected', 1, %s::json, %s::json, %s, %s "
        "FROM fence WHERE fence.ok",
        (
            *fence_params,
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


def wait_for_a_lock_wait(url: str, *, sessions: int = 1) -> None:
    """Block until ``sessions`` sessions of the test's database wait on a lock.

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
            if row is not None and row[0] >= sessions:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{sessions} sessions did not wait on locks within {WAIT} s")
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


class TestShardFencingRaceOnPostgres:
    @pytest.mark.parametrize("row", ["existing", "missing"])
    def test_a_stale_append_of_a_shard_racing_its_election_is_refused_after_it(
        self, postgres_store: EventStore, postgres_url: str, row: str
    ) -> None:
        """With the shard's election open on another connection, a stale append of the shard
        waits for it, and once it commits is refused as Fenced; nothing of it is written. When
        the election creates the shard's row, the append waits on that row's insert."""
        store = postgres_store
        elect_shard(store, "nodes/0" if row == "existing" else "nodes/9", 1)
        with raw_transaction(postgres_url) as election:
            insert_raw_event(election, "leadership-nodes/0", 2, term=2, shard="nodes/0")
            stale = in_thread(lambda: store.append("node-a", shard_termed("nodes/0", 1)))
            wait_for_a_lock_wait(postgres_url)
            assert not stale.done()
            election.commit()

            with pytest.raises(Fenced) as raised:
                stale.result(timeout=WAIT)

        assert (raised.value.term, raised.value.current_term) == (1, 2)
        assert store.stream_version("node-a") == 0
        assert (store.head(), store.leader_term("nodes/0")) == (2, 2)
        assert store.verify().ok

    @pytest.mark.parametrize("row", ["existing", "missing"])
    def test_a_stale_append_of_a_shard_that_got_in_first_commits_before_its_election(
        self, postgres_store: EventStore, postgres_url: str, row: str
    ) -> None:
        """With a stale append of the shard open, the shard's election waits for it and then
        commits after it: the log shows the shard's term 1 then 2, never the reverse."""
        store = postgres_store
        elect_shard(store, "nodes/0" if row == "existing" else "nodes/9", 1)
        with raw_transaction(postgres_url) as stale:
            insert_raw_event(stale, "node-stale", 1, term=1, shard="nodes/0")
            election = in_thread(lambda: elect_shard(store, "nodes/0", 2))
            wait_for_a_lock_wait(postgres_url)
            assert not election.done()
            stale.commit()

            result = election.result(timeout=WAIT)

        assert result.first_position == 3
        assert shard_terms_along_the_log(store, "nodes/0")[-2:] == [1, 2]
        assert store.leader_term("nodes/0") == 2
        assert store.verify().ok

    @pytest.mark.parametrize("row", ["existing", "missing"])
    def test_the_database_alone_orders_two_racing_inserts_of_a_shard(
        self, postgres_store: EventStore, postgres_url: str, row: str
    ) -> None:
        """Two inserts of one shard that do not meet on any unique index: the stale one waits
        for the open election and is refused when it commits, by the shard's fence alone."""
        elect_shard(postgres_store, "nodes/0" if row == "existing" else "nodes/9", 1)
        with raw_transaction(postgres_url) as election, raw_transaction(postgres_url) as stale:
            insert_raw_event(election, "leadership-nodes/0", 2, term=2, shard="nodes/0")
            refused = in_thread(
                lambda: insert_raw_event(stale, "node-stale", 1, term=1, skip=1, shard="nodes/0")
            )
            wait_for_a_lock_wait(postgres_url)
            assert not refused.done()
            election.commit()

            with pytest.raises(psycopg.Error) as raised:
                refused.result(timeout=WAIT)

        assert raised.value.sqlstate == "LT001"
        assert postgres_store.leader_term("nodes/0") == 2

    @pytest.mark.parametrize(
        ("electing", "appending"),
        [("nodes/0", "nodes/1"), (None, "nodes/1"), ("nodes/0", None)],
        ids=["shard beside shard", "log-wide beside shard", "shard beside log-wide"],
    )
    def test_an_open_election_does_not_hold_up_another_fences_append(
        self,
        postgres_store: EventStore,
        postgres_url: str,
        electing: str | None,
        appending: str | None,
    ) -> None:
        """While one fence holds an election's row lock (its term raised, not yet committed),
        an append on another fence commits at once: their statements share no row lock. (The
        election is the fence alone, so the global position index does not order them.)"""
        store = postgres_store
        for fence in (electing, appending):
            if fence is None:
                elect(store, 1)
            else:
                elect_shard(store, fence, 1)
        head = store.head()
        events = termed(1) if appending is None else shard_termed(appending, 1)
        with raw_transaction(postgres_url) as election:
            if electing is None:
                election.execute("SELECT fleetledger_fence(2, 2)")
            else:
                election.execute(
                    "SELECT fleetledger_fence_shards(%s::text[], '{2}', '{2}')", ([electing],)
                )

            result = in_thread(lambda: store.append("node-a", events)).result(timeout=WAIT)

            assert result.first_position == head + 1
            election.commit()
        assert store.leader_term(electing) == 2
        assert store.leader_term(appending) == 1
        assert store.verify().ok

    def test_the_function_locks_shards_in_sorted_order(
        self, postgres_store: EventStore, postgres_url: str
    ) -> None:
        """A statement naming nodes/1 before nodes/0 still takes nodes/0 first: waiting for an
        open election of nodes/1, it already holds nodes/0, so an election of nodes/0 waits
        for it. (Taken in the order given, nodes/0 would be free and that election would
        not wait.) One total order is what keeps two such statements from deadlocking."""
        elect_shard(postgres_store, "nodes/0", 1)
        elect_shard(postgres_store, "nodes/1", 1)
        fence = "SELECT fleetledger_fence_shards(%s::text[], %s::bigint[], %s::bigint[])"
        with (
            raw_transaction(postgres_url) as first_election,
            raw_transaction(postgres_url) as both,
            raw_transaction(postgres_url) as second_election,
        ):
            first_election.execute(fence, (["nodes/1"], [2], [2]))
            checked = in_thread(
                lambda: both.execute(fence, (["nodes/1", "nodes/0"], [2, 1], [2, 1]))
            )
            wait_for_a_lock_wait(postgres_url)
            raised = in_thread(lambda: second_election.execute(fence, (["nodes/0"], [5], [5])))
            wait_for_a_lock_wait(postgres_url, sessions=2)
            assert not (checked.done() or raised.done())

            first_election.commit()
            checked.result(timeout=WAIT)
            assert not raised.done()
            both.commit()
            raised.result(timeout=WAIT)
            second_election.commit()

        assert postgres_store.leader_term("nodes/0") == 5
        assert postgres_store.leader_term("nodes/1") == 2
