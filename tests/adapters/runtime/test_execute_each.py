"""execute_each: one pass over many streams, many streams per commit, each its own fate."""

from __future__ import annotations

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.runtime import CommandRefused, HostedStream, execute_each
from fleetledger.eventstore import EventStore
from tests.counting_store import CountingStore

from .test_example_aggregate import COUNTER, EPOCH, Command, Counter, Event, Increment

Hosted = HostedStream[Counter, Command, Event]


def plan(request_id: str, by: int = 1) -> object:
    return lambda at: [(Increment(request_id, by, at), request_id)]


def streams(store: object, count: int) -> list[Hosted]:
    clock = ManualClock(EPOCH)
    return [HostedStream(store, COUNTER, f"counter-e{n}", clock=clock) for n in range(count)]  # type: ignore[arg-type]


def test_a_pass_over_many_streams_commits_once(store: EventStore) -> None:
    counting = CountingStore(store)
    hosted = streams(counting, 40)

    answers = execute_each([(s, plan(f"r-{n}", n + 1)) for n, s in enumerate(hosted)])  # type: ignore[misc]

    assert counting.commits == 1
    assert [s.state.total for s in hosted] == [n + 1 for n in range(40)]
    assert [a.events[0].request_id for a in answers] == [f"r-{n}" for n in range(40)]  # type: ignore[union-attr]
    assert [r.stream_version for r in store.read_all(after=0)] == [1] * 40


def test_a_refused_item_fails_alone(store: EventStore) -> None:
    hosted = streams(store, 3)

    answers = execute_each([(s, plan(f"r-{n}", 0 if n == 1 else 1)) for n, s in enumerate(hosted)])  # type: ignore[misc]

    assert isinstance(answers[1], CommandRefused)
    assert [s.state.total for s in hosted] == [1, 0, 1]


def test_one_stream_twice_is_one_group(store: EventStore) -> None:
    [stream] = streams(store, 1)

    answers = execute_each([(stream, plan("a")), (stream, plan("b", 2))])  # type: ignore[list-item]

    assert stream.state.total == 3
    assert [a.events[0].request_id for a in answers] == ["a", "b"]  # type: ignore[union-attr]


def test_a_stream_behind_the_log_catches_up_and_decides_again(store: EventStore) -> None:
    [stale] = streams(store, 1)
    [other] = streams(store, 1)
    stale.execute(plan("first"))  # type: ignore[arg-type]
    other.execute(plan("elsewhere"))  # type: ignore[arg-type]
    [fresh] = streams(store, 2)[1:]

    answers = execute_each([(stale, plan("again")), (fresh, plan("new"))])  # type: ignore[list-item]

    assert not any(isinstance(a, BaseException) for a in answers)
    assert stale.state.total == 3
    assert stale.version == 3


def test_observers_hear_before_it_returns(store: EventStore) -> None:
    hosted = streams(store, 2)
    heard: list[str] = []
    for s in hosted:
        s.on_events(lambda folded: heard.extend(f.event.request_id for f in folded))  # type: ignore[union-attr]

    execute_each([(s, plan(f"r-{n}")) for n, s in enumerate(hosted)])  # type: ignore[misc]

    assert heard == ["r-0", "r-1"]


def test_rounds_are_bounded(store: EventStore) -> None:
    counting = CountingStore(store)
    hosted = streams(counting, 1001)

    execute_each([(s, plan(f"r-{n}")) for n, s in enumerate(hosted)])  # type: ignore[misc]

    assert counting.commits == 3
    assert sum(s.state.total for s in hosted) == 1001


class TestStartFrom:
    def test_a_stream_started_from_a_fold_reads_nothing_and_appends_after_it(
        self, store: EventStore
    ) -> None:
        [writer] = streams(store, 1)
        writer.execute(plan("a", 2))  # type: ignore[arg-type]
        writer.execute(plan("b", 3))  # type: ignore[arg-type]
        [seeded] = streams(store, 1)

        assert seeded.start_from(writer.state, version=2, last_event_id=writer.last_event_id)
        seeded.execute(plan("c"))  # type: ignore[arg-type]

        assert seeded.state.total == 6
        assert [r.stream_version for r in store.read_stream("counter-e0")] == [1, 2, 3]

    def test_a_loaded_stream_is_not_started_again(self, store: EventStore) -> None:
        [stream] = streams(store, 1)
        stream.execute(plan("a"))  # type: ignore[arg-type]

        assert not stream.start_from(Counter(total=99), version=7, last_event_id="x")
        assert (stream.state.total, stream.version) == (1, 1)
