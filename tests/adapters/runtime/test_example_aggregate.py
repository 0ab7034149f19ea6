"""A new aggregate on the host needs only its domain, its codec and its reactors.

The counter below is the whole capability: pure ``initial_state / evolve / decide /
next_deadline``, events registered under stable names, and one reactor. Everything else —
loading, deciding, appending with expected versions, conflicts, the clock, the reactor's
checkpoint — is the host's.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.runtime import (
    Aggregate,
    ClockDriver,
    CommandRefused,
    EventCodec,
    HostedStream,
    SnapshotCodec,
    Writer,
)
from fleetledger.adapters.runtime.reactors import Reactor, Reactors
from fleetledger.domain.codec import register_event
from fleetledger.domain.errors import Rejected
from fleetledger.eventstore import EventStore, RecordedEvent
from fleetledger.projections.recent import RecentEvents

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=10)

# -- the domain: a counter that closes its window 10 s after the first increment ---------------


@dataclass(frozen=True, slots=True)
class Increment:
    request_id: str
    by: int
    at: datetime


@dataclass(frozen=True, slots=True)
class CloseWindow:
    at: datetime


# Event ids are derived from (stream, version, type, data): an event carries what makes it
# distinct (here the request), so two different increments are never taken for one re-sent.
@register_event("example.Incremented")
@dataclass(frozen=True, slots=True)
class Incremented:
    request_id: str
    by: int
    at: datetime


@register_event("example.WindowClosed")
@dataclass(frozen=True, slots=True)
class WindowClosed:
    total: int
    at: datetime


Command: TypeAlias = Increment | CloseWindow
Event: TypeAlias = Incremented | WindowClosed


@dataclass(frozen=True, slots=True)
class Counter:
    total: int = 0
    opened_at: datetime | None = None
    closed: int = 0


def evolve(state: Counter, event: Event) -> Counter:
    if isinstance(event, Incremented):
        return Counter(state.total + event.by, state.opened_at or event.at, state.closed)
    return Counter(0, None, state.closed + 1)


def decide(state: Counter, command: Command) -> list[Event]:
    if isinstance(command, Increment):
        if command.by < 1:
            raise Rejected(f"increment by a positive amount, not {command.by}")
        return [Incremented(command.request_id, command.by, command.at)]
    due = next_deadline(state)
    if due is None or command.at < due:
        return []
    return [WindowClosed(state.total, command.at)]


def next_deadline(state: Counter) -> datetime | None:
    return None if state.opened_at is None else state.opened_at + WINDOW


COUNTER: Aggregate[Counter, Command, Event] = Aggregate(
    name="counter",
    initial_state=Counter,
    evolve=evolve,
    decide=decide,
    codec=EventCodec("counter", (Incremented, WindowClosed)),
    stream_of=lambda key: f"counter-{key}",
    next_deadline=next_deadline,
    tick=CloseWindow,
)

# -- the tests -------------------------------------------------------------------------------------


Hosted = HostedStream[Counter, Command, Event]
_requests = itertools.count(1)


def hosted(store: EventStore, clock: ManualClock, key: str = "a") -> Hosted:
    return HostedStream(store, COUNTER, COUNTER.stream_of(key), clock=clock)


def increment(stream: Hosted, by: int = 1) -> None:
    request_id = f"req-{next(_requests)}"
    stream.execute(lambda at: [(Increment(request_id, by, at), request_id)])


class TestHostedCounter:
    def test_decisions_are_appended_and_folded(self, store: EventStore) -> None:
        """Commands decide on the folded state; their events land in the counter's stream."""
        stream = hosted(store, ManualClock(EPOCH))

        increment(stream, 2)
        increment(stream, 3)

        assert stream.state.total == 5
        assert [e.type for e in store.read_stream("counter-a")] == ["example.Incremented"] * 2

    def test_a_refused_command_appends_nothing(self, store: EventStore) -> None:
        """The aggregate's refusal reaches the caller with its reason; the log is unchanged."""
        stream = hosted(store, ManualClock(EPOCH))

        with pytest.raises(CommandRefused, match="positive amount"):
            increment(stream, 0)

        assert store.head() == 0

    def test_a_second_host_catches_up_on_a_conflict(self, store: EventStore) -> None:
        """Two hosts of one stream: the stale one reloads and decides again, losing nothing."""
        clock = ManualClock(EPOCH)
        first, second = hosted(store, clock), hosted(store, clock)
        increment(first)
        increment(second)
        increment(first)

        assert first.state.total == 3
        assert store.stream_version("counter-a") == 3

    def test_a_reload_folds_the_log_again(self, store: EventStore) -> None:
        """A new host (a restart) rebuilds the same state from the log."""
        clock = ManualClock(EPOCH)
        increment(hosted(store, clock), 4)

        assert hosted(store, clock).state.total == 4


class TestClock:
    def test_the_driver_closes_the_window_at_its_deadline(self, store: EventStore) -> None:
        """The host's clock driver ticks exactly when next_deadline has passed."""
        clock = ManualClock(EPOCH)
        stream = hosted(store, clock)
        driver = ClockDriver(
            next_deadline=stream.next_deadline,
            tick=lambda: stream.execute(lambda at: [(CloseWindow(at), "tick")], duty=True),
            clock=clock,
            name="counter-a",
        )
        increment(stream, 7)

        assert driver.step() == EPOCH + WINDOW
        clock.advance(WINDOW)
        assert driver.step() is None

        assert stream.state.closed == 1
        assert store.read_stream("counter-a")[-1].data["total"] == 7


class TestReactor:
    def test_reacts_once_per_event_across_restarts(self, store: EventStore) -> None:
        """A reactor sees each closed window once; a new runner resumes from the checkpoint."""
        seen: list[int] = []

        def react(event: Event, record: RecordedEvent) -> None:
            assert isinstance(event, WindowClosed)
            seen.append(event.total)

        reactor = Reactor(
            name="counter-report", codec=COUNTER.codec, types=(WindowClosed,), react=react
        )
        clock = ManualClock(EPOCH)
        stream = hosted(store, clock)
        for total in (1, 2):
            increment(stream, total)
            clock.advance(WINDOW)
            stream.execute(lambda at: [(CloseWindow(at), "tick")])
            Reactors(store, [reactor]).run_until_caught_up()

        assert seen == [1, 2]

    def test_an_event_this_process_committed_is_not_decoded_again(self, store: EventStore) -> None:
        """Given the writer's recent events, the reactor is handed the very object decided."""
        seen: list[Event] = []
        reactor = Reactor(
            name="counter-report",
            codec=COUNTER.codec,
            types=(WindowClosed,),
            react=lambda event, record: seen.append(event),
        )
        recent = RecentEvents()
        clock = ManualClock(EPOCH)
        stream = HostedStream(
            store, COUNTER, COUNTER.stream_of("a"), clock=clock, writer=Writer(recent=recent)
        )
        increment(stream)
        clock.advance(WINDOW)
        decided = stream.execute(lambda at: [(CloseWindow(at), "tick")])

        Reactors(store, [reactor], recent=recent).run_until_caught_up()

        assert len(seen) == 1 and seen[0] is decided.events[0]


class TestSnapshots:
    def test_a_long_stream_loads_from_its_snapshot(self, store: EventStore) -> None:
        """With a snapshot codec the host saves the state every N events and a new host starts
        from it, folding only the tail."""
        restored: list[dict[str, int]] = []

        def from_data(data: Mapping[str, Any]) -> Counter:
            restored.append(dict(data))
            return Counter(total=data["total"], closed=data["closed"])

        counter = Aggregate(
            name="counter",
            initial_state=Counter,
            evolve=evolve,
            decide=decide,
            codec=COUNTER.codec,
            stream_of=COUNTER.stream_of,
            snapshots=SnapshotCodec(
                to_data=lambda s: {"total": s.total, "closed": s.closed},
                from_data=from_data,
                every=3,
            ),
        )
        clock = ManualClock(EPOCH)
        writer = HostedStream(store, counter, "counter-s", clock=clock)
        for _ in range(4):
            increment(writer)

        snapshot = store.load_snapshot("counter-s")
        reader = HostedStream(store, counter, "counter-s", clock=clock)

        assert snapshot is not None and snapshot.version == 3
        assert reader.state.total == 4
        assert reader.version == 4
        assert restored == [{"total": 3, "closed": 0}]
