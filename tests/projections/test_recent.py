"""Events handed over by this process's writers: read models fold them without decoding."""

from __future__ import annotations

import pytest

from fleetledger.eventstore import EventStore
from fleetledger.projections.recent import RecentEvents
from tests.adapters.runtime.test_example_aggregate import COUNTER, EPOCH, Incremented


def _appended(store: EventStore, name: str) -> tuple[str, Incremented]:
    """An event appended to the log; returns its event id and the event."""
    event = Incremented(name, 1, EPOCH)
    [record] = COUNTER.codec.encode(f"counter-{name}", 1, [event], causation_ids=["t"], actor="t")
    store.append(f"counter-{name}", [record])
    return str(record.event_id), event


class TestRecentEvents:
    def test_an_event_handed_over_is_folded_as_it_was_given(self, store: EventStore) -> None:
        """The very object handed over comes back for its record: nothing is decoded."""
        event_id, event = _appended(store, "n1")
        recent = RecentEvents()
        recent.remember([(event_id, event)])

        [record] = store.read_all()

        assert recent.decode(record) is event

    def test_an_event_not_handed_over_is_decoded(self, store: EventStore) -> None:
        """Another process's event (or one evicted) is decoded from the log, equal to it."""
        _, event = _appended(store, "n1")
        [record] = store.read_all()

        decoded = RecentEvents().decode(record)

        assert decoded == event and decoded is not event

    def test_the_oldest_events_go_past_the_capacity(self, store: EventStore) -> None:
        """Memory stays bounded: past ``capacity`` the first handed over is decoded again."""
        first_id, first = _appended(store, "n1")
        second_id, second = _appended(store, "n2")
        recent = RecentEvents(capacity=1)
        recent.remember([(first_id, first)])
        recent.remember([(second_id, second)])

        old, new = store.read_all()

        assert len(recent) == 1
        assert recent.decode(new) is second
        assert recent.decode(old) is not first

    def test_a_capacity_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="capacity must be at least 1"):
            RecentEvents(capacity=0)

    def test_an_openings_limit_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="openings must be at least 1"):
            RecentEvents(openings=0)


class TestOpenings:
    def test_an_opening_is_handed_over_once(self) -> None:
        """The stream hosting it takes it; a second stream object for the same id reads."""
        recent = RecentEvents()
        recent.opened("batch-1", [("id-1", "first"), ("id-2", "second")])

        assert recent.take_opening("batch-1") == (("id-1", "first"), ("id-2", "second"))
        assert recent.take_opening("batch-1") is None

    def test_the_oldest_openings_go_past_the_limit(self) -> None:
        recent = RecentEvents(openings=1)
        recent.opened("batch-1", [("id-1", "first")])
        recent.opened("batch-2", [("id-2", "second")])

        assert recent.take_opening("batch-1") is None
        assert recent.take_opening("batch-2") == (("id-2", "second"),)
